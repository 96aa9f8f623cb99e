#pragma once
#include <imgui.h>

namespace memsim::ui {
// One colour per breakdown slot: the allocator components in Component order, then cache, CUDA context and NCCL.
constexpr int kSlotCount = 12;
inline ImU32 slot_color(int slot) {
  static const ImU32 colors[kSlotCount] = {
      IM_COL32(76, 114, 176, 255),   // weights
      IM_COL32(221, 132, 82, 255),   // gradients
      IM_COL32(85, 168, 104, 255),   // optimizer states
      IM_COL32(196, 78, 82, 255),    // activations
      IM_COL32(129, 114, 179, 255),  // temporaries
      IM_COL32(147, 120, 96, 255),   // communication
      IM_COL32(218, 139, 195, 255),  // framework overhead
      IM_COL32(100, 130, 150, 255),  // reference model
      IM_COL32(60, 200, 170, 255),   // generation
      IM_COL32(140, 140, 140, 255),  // allocator cache
      IM_COL32(204, 185, 116, 255),  // CUDA context
      IM_COL32(100, 181, 205, 255),  // NCCL buffers
  };
  return colors[slot >= 0 && slot < kSlotCount ? slot : kSlotCount - 1];
}

// The timeline's series (straight alpha), drawn over the chart's frame colour (ImGuiCol_FrameBg).
constexpr ImU32 kTimelineReserved = IM_COL32(140, 140, 140, 90);
constexpr ImU32 kTimelineAllocated = IM_COL32(76, 150, 230, 200);
}  // namespace memsim::ui
