// Keys for Dear ImGui, one press or release of a key per frame. ImGui 1.86's GLFW backend only records whether a
// key is down when the frame starts, so a key pressed and released between two frames (a quick tap, a slow frame
// under a software renderer, a test's keyboard) never reaches the interface. The queue keeps GLFW's key and
// character events in order and hands them to the backend at the start of each frame, stopping before a second
// event of a key already seen in that frame: the press lands in one frame, its release in the next.
// Mouse buttons take their turn in the same queue, and a button's press ends its frame: ImGui acts on a click when
// the button comes up (a combo opens then), so what was typed after the click waits for that frame instead of
// reaching a frame in which nothing takes it (a loaded machine delivers the click and the next letters together,
// and the model picker lost the first letter of "llama"). Platform layer (GLFW); both main loops use it.
#pragma once
#include <GLFW/glfw3.h>
#include <imgui_impl_glfw.h>

#include <deque>
#include <vector>

namespace memsim::platform {

class KeyQueue {
 public:
  // After ImGui_ImplGlfw_InitForOpenGL(window, true): GLFW's key, character and mouse button callbacks now go
  // through the queue.
  static void install(GLFWwindow* window) {
    window_ = window;
    glfwSetKeyCallback(window, [](GLFWwindow*, int key, int scancode, int action, int mods) {
      if (action == GLFW_PRESS) ++presses_received_;
      events_.push_back({key, scancode, action, mods, 0});
    });
    glfwSetCharCallback(window, [](GLFWwindow*, unsigned int c) { events_.push_back({0, 0, kChar, 0, c}); });
    glfwSetMouseButtonCallback(window, [](GLFWwindow*, int button, int action, int mods) {
      events_.push_back({kMouseButton + button, 0, action, mods, 0});
    });
  }

  // A key event that did not come from GLFW: the page's clipboard bridge presses Ctrl+V once the browser has handed it
  // the pasted text (web_main.cpp memsim_paste). It takes its turn after the events already queued.
  static void push(int key, int action, int mods = 0) { events_.push_back({key, 0, action, mods, 0}); }

  // Whether events wait for the next frame: a loop that sleeps until the next event should not sleep now.
  static bool pending() { return !events_.empty(); }

  // For the page's tests (window.memsim.state().keys): key presses GLFW reported (repeats not counted) and those
  // handed to ImGui, so that a press lost or doubled on the way shows; and the frames begun since the last event was
  // handed over. A test waits for nothing pending and two frames since (a Tab's focus is applied and read out a frame
  // after the press) before it reads the page's state: counting drawn frames from before the key also counted frames
  // drawn for the previous key's settling, and read the state with the key still queued.
  static long presses_received() { return presses_received_; }
  static long presses_fed() { return presses_fed_; }
  static long frames_since_last_event() { return feeds_ - last_feed_; }

  // Before ImGui_ImplGlfw_NewFrame(): the events of this frame reach the backend.
  static void feed() {
    ++feeds_;
    if (!events_.empty()) last_feed_ = feeds_;
    std::vector<int> seen;
    while (!events_.empty()) {
      const Event e = events_.front();
      if (e.action != kChar) {
        for (int k : seen)
          if (k == e.key) return;  // the rest waits for the next frame
        seen.push_back(e.key);
        if (e.key >= kMouseButton) {
          ImGui_ImplGlfw_MouseButtonCallback(window_, e.key - kMouseButton, e.action, e.mods);
          if (e.action == GLFW_PRESS) {  // the click's frame ends here; the release and what follows come next frame
            events_.pop_front();
            return;
          }
          events_.pop_front();
          continue;
        }
        if (e.action == GLFW_PRESS) ++presses_fed_;
        ImGui_ImplGlfw_KeyCallback(window_, e.key, e.scancode, e.action, e.mods);
      } else {
        ImGui_ImplGlfw_CharCallback(window_, e.codepoint);
      }
      events_.pop_front();
    }
  }

 private:
  static constexpr int kChar = -1;
  static constexpr int kMouseButton = 1 << 20;  // a mouse button's event: kMouseButton + button (GLFW keys are < 512)
  struct Event {
    int key, scancode, action, mods;
    unsigned int codepoint;
  };
  static inline GLFWwindow* window_ = nullptr;
  static inline std::deque<Event> events_;
  static inline long presses_received_ = 0, presses_fed_ = 0, feeds_ = 0, last_feed_ = 0;
};

}  // namespace memsim::platform
