// Fit explorer: a heatmap over two axes (micro-batch x sequence, TP x PP, GPUs x GPU type, LoRA rank x
// targets; for a model program with an image size, micro-batch x image size; for a vision-language model whose tower
// sizes its images, micro-batch x image side) coloured by the peak over the usable
// memory. Cells are simulated a few per frame, with a progress bar,
// so the interface stays responsive; clicking a cell applies its setup. A long run of varying shapes is replayed
// over fewer steps in every cell, as What helps does (panel_advice.cpp), and the caption says so.
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chart.h"
#include "core/architecture.h"
#include "core/data_shape.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "keyboard.h"
#include "panels.h"

namespace memsim::ui {

namespace {

struct Axis {
  const char* name;
  std::vector<std::string> labels;
  std::function<void(Config&, size_t)> apply;
  bool prefer_small = false;  // outline the smallest value that fits (GPUs), not the largest (micro-batch)
};

struct Cell {
  bool done = false, ok = false, fits = false;
  double ratio = 0;  // device peak / usable memory of the most loaded GPU
  int64_t peak = 0;
  std::string error;
};

std::vector<std::pair<Axis, Axis>> axis_pairs() {
  const std::vector<int64_t> mbs = {1, 2, 4, 8, 16, 32};
  const std::vector<int64_t> seqs = {512, 1024, 2048, 4096, 8192, 16384, 32768};
  const std::vector<int64_t> par = {1, 2, 4, 8};
  const std::vector<int64_t> dps = {1, 2, 4, 8, 16, 32, 64};
  const std::vector<int64_t> ranks = {4, 8, 16, 32, 64, 128, 256};
  const std::vector<std::string> targets = {"q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj", "all-linear"};
  auto labels = [](const std::vector<int64_t>& v) {
    std::vector<std::string> out;
    for (int64_t x : v) out.push_back(std::to_string(x));
    return out;
  };
  std::vector<std::string> gpu_ids;
  for (const auto& g : gpus()) gpu_ids.emplace_back(g.id);
  return {
      {{"micro-batch", labels(mbs), [=](Config& c, size_t i) { c.training.micro_batch_size = mbs[i]; }},
       {"sequence", labels(seqs), [=](Config& c, size_t i) { c.training.sequence_length = seqs[i]; }}},
      {{"tensor parallel", labels(par), [=](Config& c, size_t i) { c.parallel.tensor_parallel_size = par[i]; }},
       {"pipeline parallel", labels(par), [=](Config& c, size_t i) {
          c.parallel.pipeline_parallel_size = par[i];
          if (par[i] > 1) c.parallel.zero_stage = std::min<int64_t>(c.parallel.zero_stage, 1);
        }}},
      {{"data-parallel GPUs", labels(dps), [=](Config& c, size_t i) { c.parallel.data_parallel_size = dps[i]; }, true},
       {"GPU", gpu_ids, [=](Config& c, size_t i) { c.hardware.gpu = gpu_ids[i]; }}},
      {{"LoRA rank", labels(ranks), [=](Config& c, size_t i) {
          if (c.peft.method != "lora" && c.peft.method != "dora") c.peft.method = "lora";
          c.peft.lora_rank = ranks[i];
        }},
       {"targets", targets, [=](Config& c, size_t i) {
          if (c.peft.method != "lora" && c.peft.method != "dora") c.peft.method = "lora";
          c.peft.target_modules = targets[i];
        }}},
  };
}

// A model program's sequence is its inputs' shape: where the program has an image size (image_size, img_size, a
// diffusion UNet's resolution) or a label length (Whisper's target_length: its clips are always 30 s), the first
// pair's second axis is that instead of the sequence length. Worked out once per program.
struct ImageAxis {
  std::string spec, key;
  double default_size = 0;
};
const ImageAxis& image_axis(const ModelConfig& m) {
  static ImageAxis cached;
  if (cached.spec != m.architecture) {
    cached = {m.architecture, "", 0};
    std::shared_ptr<const Architecture> plain;
    decode_architecture(m.architecture, "", plain);
    if (plain)
      for (const auto& [name, value] : plain->defaults)
        if (name == "image_size" || name == "img_size" || name == "resolution" || name == "target_length" || name == "sequence_length")
          cached.key = name, cached.default_size = value;
  }
  return cached;
}

Axis image_size_axis(const ImageAxis& ia) {
  // A classifier's input sizes; a diffusion UNet's training resolutions (its resolution argument, 512 and 1024 px
  // the SD 1.x and SDXL defaults).
  static const std::vector<int64_t> classifier = {128, 224, 256, 384, 448, 512, 768};
  static const std::vector<int64_t> diffusion = {256, 384, 512, 640, 768, 1024, 1280};
  // A speech model's padded label length per batch, up to Whisper's 448 positions.
  static const std::vector<int64_t> labels_per_clip = {32, 64, 96, 128, 192, 256, 448};
  const bool speech = ia.key == "target_length";
  // A language model written as a program (Mamba-2): its tokens per sample.
  static const std::vector<int64_t> tokens = {512, 1024, 2048, 4096, 8192, 16384, 32768};
  const bool sequence = ia.key == "sequence_length";
  const std::vector<int64_t>& sizes = ia.key == "resolution" ? diffusion : speech ? labels_per_clip : sequence ? tokens : classifier;
  std::vector<std::string> labels;
  for (int64_t s : sizes) labels.push_back(std::to_string(s));
  const std::vector<int64_t>* list = &sizes;  // a static table
  return {speech ? "label tokens" : sequence ? "sequence" : "image size", labels, [ia, list](Config& c, size_t i) {
            c.model.architecture_args = set_architecture_arg(c.model.architecture_args, ia.key,
                                                             static_cast<double>((*list)[i]), ia.default_size);
          }};
}

// A vision-language model whose tower sizes each image from its pixels (Qwen2-VL's and Qwen2.5-VL's smart_resize,
// LLaVA-NeXT's anyres tiles): the first pair's second axis is the images' side (square images) instead of the
// sequence. Each cell keeps the samples' text: the sequence grows or shrinks by the image tokens, as What helps'
// max_pixels suggestion does. Worked out once per tower and arguments.
bool tower_sizes_images(const ModelConfig& m) {
  static std::string spec, args;
  static bool sized = false;
  if (spec != m.vision_tower || args != m.vision_tower_args) {
    spec = m.vision_tower, args = m.vision_tower_args, sized = false;
    std::shared_ptr<const Architecture> plain;
    decode_architecture(m.vision_tower, "", plain);
    if (plain) {
      bool h = false, w = false, pixels = false, anyres = false;
      for (const auto& [name, value] : plain->defaults) {
        h |= name == "image_height", w |= name == "image_width", pixels |= name == "max_pixels";
        anyres |= name == "anyres" && architecture_arg(m.vision_tower_args, "anyres", value) == 1;
      }
      sized = h && w && (pixels || anyres);
    }
  }
  return sized;
}

Axis image_side_axis(const Config& base) {
  static const std::vector<int64_t> sides = {224, 336, 448, 672, 896, 1344, 1792};
  std::vector<std::string> labels;
  for (int64_t s : sides) labels.push_back(std::to_string(s));
  const int64_t images = base.data.images_per_sample;
  const int64_t text = base.training.sequence_length - images * vision_image_tokens(base.model);
  return {"image side", labels, [images, text](Config& c, size_t i) {
            for (const char* key : {"image_height", "image_width"})
              c.model.vision_tower_args = set_architecture_arg(c.model.vision_tower_args, key, static_cast<double>(sides[i]), -1);
            c.training.sequence_length = std::max<int64_t>(1, text + images * vision_image_tokens(c.model));
          }};
}

// Peak over usable memory: green fades as the setup gets tight, yellow within the headroom, red over it (up
// to 150%, darker the further over). Cells not computed yet, or invalid, are grey.
ColorScale fit_scale() {
  ColorScale s;
  s.lo = 0;
  s.bands = {{{0.8f, IM_COL32(50, 204, 70, 255), IM_COL32(50, 140, 70, 255)},
              {1.0f, IM_COL32(200, 170, 50, 255), IM_COL32(200, 170, 50, 255)},
              {1.5f, IM_COL32(190, 60, 60, 255), IM_COL32(190, 40, 60, 255)}}};
  s.missing = IM_COL32(60, 60, 60, 255);
  return s;
}

}  // namespace

bool draw_explorer_panel(Config& config, Unit unit, bool ready) {
  static int pair_index = 0;
  static int cached_pair = -1;
  static Config cached_for;
  static std::vector<Cell> cells;
  static size_t next = 0;
  static int64_t run_steps = 0, variant_steps = 0;  // as in the advice panel: a long run's cells replay fewer steps
  static std::unique_ptr<Simulation> in_flight;      // cell `next`, under way
  static const auto pairs = axis_pairs();
  bool changed = false;

  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 18);
  const ImageAxis& ia = config.model.architecture.empty() ? ImageAxis{} : image_axis(config.model);
  static Axis image_y;
  static std::string image_y_for;
  if (!ia.key.empty() && image_y_for != ia.spec) image_y = image_size_axis(ia), image_y_for = ia.spec;
  // A vision-language model's image side: rebuilt with the setup, whose text length each cell keeps.
  const bool sided = ia.key.empty() && !config.model.vision_tower.empty() && tower_sizes_images(config.model);
  static Axis side_y;
  static Config side_for;
  if (sided && !(side_for == config)) side_y = image_side_axis(config), side_for = config;
  const char* names[] = {ia.key == "target_length" ? "micro-batch x label tokens"
                         : ia.key == "sequence_length" ? "micro-batch x sequence"
                         : !ia.key.empty()          ? "micro-batch x image size"
                         : sided                    ? "micro-batch x image side"
                                                    : "micro-batch x sequence",
                         "tensor x pipeline parallel", "GPUs x GPU type", "LoRA rank x targets"};
  index_combo("axes", pair_index, {names[0], names[1], names[2], names[3]});
  announce_focus(std::string("axes: ") + names[pair_index] + ", list");
  const Axis& xa = pairs[static_cast<size_t>(pair_index)].first;
  const Axis& ya = pair_index == 0 && !ia.key.empty() ? image_y
                  : pair_index == 0 && sided     ? side_y
                                                 : pairs[static_cast<size_t>(pair_index)].second;
  const size_t nx = xa.labels.size(), ny = ya.labels.size();
  if (pair_index != cached_pair || !(config == cached_for)) {
    cached_pair = pair_index;
    cached_for = config;
    cells.assign(nx * ny, Cell{});
    next = 0;
    run_steps = planned_run_steps(config);
    variant_steps = run_steps_within(config, kVariantRunLayerPasses);
    in_flight.reset();
  }
  // Simulate cells for at most ~8 ms per frame, once the setup's own simulation is done.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(8);
  while (ready && next < cells.size() && std::chrono::steady_clock::now() < deadline) {
    if (!in_flight) {
      Config c = config;
      xa.apply(c, next % nx);
      ya.apply(c, next / nx);
      if (variant_steps > 0) c.data.steps = variant_steps;
      in_flight = std::make_unique<Simulation>(c);
    }
    if (!advance_until(*in_flight, deadline)) break;
    const Result& r = in_flight->result();
    Cell& cell = cells[next++];
    cell.done = true;
    cell.ok = r.ok;
    if (!r.ok) cell.error = r.errors.empty() ? "invalid" : r.errors[0].message;
    cell.fits = r.ok;
    for (const auto& d : r.devices) {
      cell.fits = cell.fits && d.verdict == Verdict::Fits;  // the results panel's verdict: the band's top fits
      if (!d.fixed_share && d.peak.device_bytes > cell.peak) {
        cell.peak = d.peak.device_bytes;
        cell.ratio = static_cast<double>(d.peak.device_bytes) / static_cast<double>(std::max<int64_t>(1, d.usable_bytes));
      }
    }
    in_flight.reset();
  }
  if (next < cells.size()) {
    if (ready) note_work_left();  // until the setup is simulated, the app's own simulation keeps frames coming
    ImGui::SameLine();
    ImGui::ProgressBar(static_cast<float>(next) / static_cast<float>(cells.size()), ImVec2(ImGui::GetFontSize() * 10, 0));
  }

  // The largest x that fits in each row is outlined (e.g. the largest micro-batch for each sequence length), or
  // the smallest where fewer is better (the fewest GPUs of each type).
  const float label_w = ImGui::GetFontSize() * 4.5f;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float avail_w = ImGui::GetContentRegionAvail().x - label_w;
  const float avail_h = std::max(ImGui::GetContentRegionAvail().y - ImGui::GetTextLineHeightWithSpacing() * 2.5f, 60.0f);
  const float cw = avail_w / static_cast<float>(nx), ch = std::min(avail_h / static_cast<float>(ny), ImGui::GetFontSize() * 2.2f);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  // The cells' colours go to the chart renderer as one grid of peak / usable; the labels, the outline and the
  // clickable cells stay with ImGui.
  HeatmapChart heat;
  heat.rect = {origin.x + label_w, origin.y, origin.x + label_w + static_cast<float>(nx) * cw, origin.y + static_cast<float>(ny) * ch};
  heat.w = static_cast<int>(nx);
  heat.h = static_cast<int>(ny);
  for (const Cell& c : cells) heat.values.push_back(c.done && c.ok ? static_cast<float>(c.ratio) : -1.0f);
  heat.scale = fit_scale();
  heat.boundary_color = ImGui::GetColorU32(ImGuiCol_Text);  // white on the dark theme, black on the light one
  add_chart(dl, std::move(heat));
  for (size_t y = 0; y < ny; ++y) {
    dl->AddText(ImVec2(origin.x, origin.y + static_cast<float>(y) * ch + ch * 0.3f), ImGui::GetColorU32(ImGuiCol_Text),
                ya.labels[y].c_str());
    int64_t best = -1;
    for (size_t x = 0; x < nx; ++x)
      if (cells[y * nx + x].done && cells[y * nx + x].fits && !(xa.prefer_small && best >= 0)) best = static_cast<int64_t>(x);
    for (size_t x = 0; x < nx; ++x) {
      const Cell& c = cells[y * nx + x];
      const ImVec2 a(origin.x + label_w + static_cast<float>(x) * cw, origin.y + static_cast<float>(y) * ch);
      const ImVec2 b(a.x + cw - 2, a.y + ch - 2);
      if (static_cast<int64_t>(x) == best) dl->AddRect(a, b, IM_COL32(255, 255, 255, 255), 0, 0, 2.0f);
      if (c.done && c.ok) {
        const std::string text = bytes_text(c.peak, unit);
        dl->AddText(ImVec2(a.x + 4, a.y + ch * 0.25f), IM_COL32(255, 255, 255, 230), text.c_str());
      }
      ImGui::SetCursorScreenPos(a);
      ImGui::PushID(static_cast<int>(y * nx + x));
      if (ImGui::InvisibleButton("cell", ImVec2(std::max(cw - 2, 1.0f), std::max(ch - 2, 1.0f))) && c.done && c.ok) {
        xa.apply(config, x);
        ya.apply(config, y);
        changed = true;
      }
      // The keyboard reaches every cell (arrows, Tab) and applies it with Space or Enter: its outline and its
      // tooltip show where the focus is.
      const bool focused = item_has_keyboard_focus();
      if (focused) draw_focus_frame(a.x, a.y, b.x, b.y);
      std::string words = std::string(xa.name) + " " + xa.labels[x] + ", " + ya.name + " " + ya.labels[y] + ": ";
      if (!c.done) words += "not computed yet";
      else if (!c.ok) words += c.error;
      else words += bytes_text(c.peak, unit) + ", " + std::to_string(static_cast<int>(100 * c.ratio + 0.5)) + "% of usable, " +
                    (c.fits ? "fits" : "does not fit") + ". Space or Enter applies it";
      announce_focus(words, focused);
      if ((ImGui::IsItemHovered() || focused) && c.done) {
        ImGui::BeginTooltip();
        ImGui::Text("%s %s, %s %s", xa.name, xa.labels[x].c_str(), ya.name, ya.labels[y].c_str());
        if (c.ok) ImGui::Text("peak %s = %.0f%% of usable: %s (%s to apply)", bytes_text(c.peak, unit).c_str(),
                              100 * c.ratio, c.fits ? "fits" : "does not fit", focused ? "Space or Enter" : "click");
        else ImGui::TextUnformatted(c.error.c_str());
        ImGui::EndTooltip();
      }
      ImGui::PopID();
    }
  }
  ImGui::SetCursorScreenPos(ImVec2(origin.x, origin.y + static_cast<float>(ny) * ch + 4));
  ImGui::Dummy(ImVec2(label_w, 0));
  for (size_t x = 0; x < nx; ++x) {
    ImGui::SameLine(label_w + static_cast<float>(x) * cw + 8);
    ImGui::TextUnformatted(xa.labels[x].c_str());
  }
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("x: %s, y: %s. Green fits with room, yellow is within the headroom, red does not fit; outlined: "
                     "the largest that fits in its row, its band's top under the usable line (the fewest, for GPUs); a line "
                     "between cells: where the peak "
                     "crosses the usable memory.",
                     xa.name, ya.name);
  if (variant_steps > 0)
    ImGui::TextWrapped("A long run: every cell replays %s of its %s steps (its longest sample among them), so that the "
                       "grid comes within seconds; over the whole run reserved memory can grow further.",
                       format_count(variant_steps).c_str(), format_count(run_steps).c_str());
  ImGui::PopStyleColor();
  return changed;
}

}  // namespace memsim::ui
