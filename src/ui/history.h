// The undo history of the setup: Ctrl+Z, Ctrl+Shift+Z (or Ctrl+Y) and the toolbar's Undo, Redo and Reset walk it.
// A plain list of configs, bounded: the oldest entry goes once there are more than `capacity`. A continuous edit of
// one control (typing a number, holding a + button) is one entry, not one per keystroke or repeat: the app passes
// the control being edited as `group`, and a change in the same group as the last one replaces it. Knows the core
// only (no ImGui), so that the tests drive it directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>

#include "core/config.h"

namespace memsim::ui {

class History {
 public:
  static constexpr size_t kDefaultCapacity = 100;

  explicit History(Config present = {}, size_t capacity = kDefaultCapacity);

  // What record() did with a setup.
  enum class Recorded {
    Nothing,   // the setup is the present one
    NewEntry,  // the setup before it is now an undo entry (redo is cleared)
    Merged,    // the same continuous edit as the last change: the present entry was replaced, no new entry
  };
  // The setup is now `c`, after an edit of `group` (0: a change of its own, e.g. a preset, a load, Apply). A change in
  // the group of the last change (until end_group()) merges into its entry; one that brings the setup back to where
  // the edit began (typed, then undone by Escape) leaves no entry at all.
  Recorded record(const Config& c, uint64_t group = 0);
  // The continuous edit is over (the control is no longer being edited): the next change is an entry of its own.
  void end_group() { group_ = 0; }
  uint64_t group() const { return group_; }

  bool can_undo() const { return !undo_.empty(); }
  bool can_redo() const { return !redo_.empty(); }
  // The setup before the present one, which becomes the present one (the present goes onto the redo list). Only when
  // can_undo(); likewise redo().
  const Config& undo();
  const Config& redo();

  const Config& present() const { return present_; }
  size_t undo_depth() const { return undo_.size(); }
  size_t redo_depth() const { return redo_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  Config present_;
  std::deque<Config> undo_, redo_;  // the oldest first; the next to undo (redo) at the back
  size_t capacity_;
  uint64_t group_ = 0;  // the continuous edit the present entry belongs to; 0: none
};

}  // namespace memsim::ui
