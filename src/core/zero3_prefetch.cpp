// DeepSpeed ZeRO-3's fetches (partitioned_param_coordinator.py fetch_sub_module, the same from v0.8 to v0.14). Every
// module call all-gathers the module's own parameters and, once the first forward and backward have recorded the
// module trace, prefetches further along it while min(stage3_max_live_parameters - n_available,
// stage3_prefetch_bucket_size) > 0, at least one parameter per call. Parameterless modules (the decoder layer, its
// attention and MLP containers, activations, rotary) call it too, so the prefetch runs ahead until the gathered
// parameters reach max_live (1e9 elements by default), the last one overshooting it; release_sub_module frees each
// parameter after its module, so the working set stays at max_live elements in forward and in backward, whatever the
// layer size (a 7B-class model holds about five layers, not one). n_available counts elements, not bytes. Frozen
// parameters are fetched in backward too: the fetch follows the module output's gradient (PreBackwardFunction),
// never param.requires_grad. The recorded trace is one forward and its backward (reset_step runs at the next
// forward, parameter_offload.py _start_of_forward_hook from v0.15.4), so near the forward's end the prefetch scans
// into the backward: every parameter it passes gets __most_recent_step_id_param_fetched_for set to that later use
// (v0.16.4 lines 384-386, whatever its status), and __params_to_release keeps a parameter marked beyond the current
// step. The last layers, gathered for their forward, stay gathered to their backward, up to max_live elements with
// the head: through the loss and any other engine's pass between (a TRL reference model's own forward).
// docs/research/zero3-reference.md section 2.
#include "zero3_prefetch.h"

#include <algorithm>

#include "checked.h"

namespace memsim {

bool Zero3Prefetch::next_in_trace(const Trace& trace, int64_t& slot, bool& backward) {
  const int64_t last = std::min(trace.end_layer, trace.num_layers);
  const int64_t floor = std::max(trace.first_layer, trace.backward_first_layer);
  if (backward) {
    if (slot - 1 < floor) return false;
    --slot;
    return true;
  }
  if (slot + 1 < last || (slot + 1 == trace.num_layers && trace.has_post)) {
    ++slot;
    return true;
  }
  // The forward's end: the recorded trace goes on into the backward (reset_step comes only at the next forward), so
  // the prefetch scans the backward's first modules while the forward's last ones are still gathered. Every parameter
  // it passes is marked for that later use (__most_recent_step_id_param_fetched_for) and __params_to_release keeps it:
  // the last layers stay gathered from their forward to their backward, up to max_live elements with the head.
  if (!trace.has_post || trace.forward_only || last <= floor) return false;
  slot = last - 1;
  backward = true;
  return true;
}

void Zero3Prefetch::fetch(Host& host, int64_t slot, bool backward, int64_t max_live_elements, const Trace& trace,
                          std::vector<uint32_t>& out) {
  // The module's own parameters: those the prefetch gathered already are taken over, the rest gathered now.
  size_t from = 0;
  if (!window_.empty() && window_.front().slot == slot && window_.front().backward == backward) {
    Slot& w = window_.front();
    out.insert(out.end(), w.tensors.begin(), w.tensors.end());
    from = w.next_param;
    ahead_elems_ -= w.elems;
    window_.pop_front();
  } else {
    release_window(host);  // another pass (a micro-batch, a chunk) left it: nothing in it is next
  }
  const auto& own = host.params(slot);
  int64_t live = ahead_elems_;
  for (size_t i = 0; i < own.size(); ++i) {
    if (host.persistent(own[i])) continue;
    live = add(live, own[i].numel);
    if (i >= from) out.push_back(host.gather(own[i], slot));
  }
  if (!trace_complete_) return;
  while (live < max_live_elements) {
    if (window_.empty() || window_.back().next_param == host.params(window_.back().slot).size()) {
      int64_t next = window_.empty() ? slot : window_.back().slot;
      bool next_backward = window_.empty() ? backward : window_.back().backward;
      if (!next_in_trace(trace, next, next_backward)) break;
      window_.push_back({next, next_backward, false, 0, {}, 0});
      if (!backward && next_backward && next >= slot) {  // its forward's parameters are gathered: marked, not fetched
        window_.back().kept = true;
        window_.back().next_param = host.params(next).size();
      }
      continue;  // (a module without parameters, a model program's concatenation: the check above moves past it)
    }
    Slot& w = window_.back();
    const ParamTensor& t = host.params(w.slot)[w.next_param++];
    if (host.persistent(t)) continue;
    w.tensors.push_back(host.gather(t, w.slot));
    w.elems = add(w.elems, t.numel);
    ahead_elems_ = add(ahead_elems_, t.numel);
    live = add(live, t.numel);
  }
  if (backward) return;
  // The forward's own parameters stay gathered to the backward use the prefetch has marked: they move into that slot
  // of the window (the caller, which frees `out` after the module, frees nothing).
  for (Slot& w : window_) {
    if (!w.kept || !w.backward || w.slot != slot) continue;
    int64_t elems = 0;
    for (const ParamTensor& t : own)
      if (!host.persistent(t)) elems = add(elems, t.numel);
    w.tensors.insert(w.tensors.end(), out.begin(), out.end());
    w.elems = add(w.elems, elems);
    ahead_elems_ = add(ahead_elems_, elems);
    out.clear();
    break;
  }
}

void Zero3Prefetch::release_window(Host& host) {
  for (auto& w : window_)
    for (uint32_t t : w.tensors) host.release(t);
  window_.clear();
  ahead_elems_ = 0;
}

}  // namespace memsim
