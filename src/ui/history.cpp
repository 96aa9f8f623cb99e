#include "history.h"

#include <algorithm>
#include <utility>

namespace memsim::ui {

History::History(Config present, size_t capacity) : present_(std::move(present)), capacity_(std::max<size_t>(capacity, 1)) {}

History::Recorded History::record(const Config& c, uint64_t group) {
  if (c == present_) return Recorded::Nothing;
  if (group != 0 && group == group_) {
    present_ = c;
    if (!undo_.empty() && undo_.back() == present_) {
      // The edit came back to where it began: its entry goes, and a further change in it starts a new one.
      undo_.pop_back();
      group_ = 0;
    }
    return Recorded::Merged;
  }
  undo_.push_back(std::move(present_));
  if (undo_.size() > capacity_) undo_.pop_front();
  redo_.clear();
  present_ = c;
  group_ = group;
  return Recorded::NewEntry;
}

const Config& History::undo() {
  if (undo_.empty()) return present_;
  redo_.push_back(std::move(present_));
  present_ = std::move(undo_.back());
  undo_.pop_back();
  group_ = 0;
  return present_;
}

const Config& History::redo() {
  if (redo_.empty()) return present_;
  undo_.push_back(std::move(present_));
  present_ = std::move(redo_.back());
  redo_.pop_back();
  group_ = 0;
  return present_;
}

}  // namespace memsim::ui
