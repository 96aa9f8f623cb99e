// memsim-cli: the simulator from the command line. Uses only the core.
//   memsim-cli estimate --config FILE.json [--format json|table] [--set KEY=VALUE]... [--timeline] [--suggest]
//   memsim-cli estimate --hf-config config.json ...
//   memsim-cli estimate --preset ID --accelerate-config default_config.yaml ...
//   memsim-cli estimate --link 'https://host/#memsim=3&...&c=...'   (a link the page wrote, or its bare fragment)
//   memsim-cli estimate ... --lengths-file lengths.txt   (per-sample token lengths -> data.sample_lengths)
//   memsim-cli estimate --architecture vit.json --set model.architecture_args=num_labels=10   (a model program)
//   memsim-cli config [--config FILE|-] [--link LINK] [--hf-config FILE] [--set KEY=VALUE]... [--format json|fragment]
//   memsim-cli keys [--long]
//   memsim-cli schema                  (the config's JSON Schema, from the field registry)
//   memsim-cli validate DIR [--measured DIR]... [--residuals FILE]
//                                      (published measurements as configs -> markdown report, and the band's table)
// Exit codes: 0 success, 2 invalid input (one line on stderr naming the field), 1 other failures.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/advice.h"
#include "core/architecture.h"
#include "core/band.h"
#include "core/catalog.h"
#include "core/data_shape.h"
#include "core/fields.h"
#include "core/format.h"
#include "core/heap.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validation.h"

using namespace memsim;

namespace {

constexpr const char* kUsage =
    "usage: memsim-cli estimate [--config FILE|-] [--link LINK] [--hf-config FILE] [--deepspeed-config FILE]\n"
    "                           [--accelerate-config FILE] [--preset ID] [--architecture FILE] [--lengths-file FILE]\n"
    "                           [--set KEY=VALUE]... [--format json|table] [--timeline] [--suggest]\n"
    "--lengths-file reads per-sample token lengths (one per line, or a JSON array) into data.sample_lengths as\n"
    "percentiles and data.dataset_samples as their count, with data.lengths=samples: memsim replays the run.\n"
    "--architecture reads a model program (docs/extending.md, src/core/catalog/architectures/vit.json) into\n"
    "model.architecture; its hyperparameters are set with --set model.architecture_args=num_labels=10,image_size=384.\n"
    "--suggest adds what helps: each single change that lowers the peak, simulated in full, ranked by the memory "
    "it saves.\n"
    "       memsim-cli config [same inputs] [--format json|fragment|deepspeed]\n"
    "       memsim-cli keys [--long] | presets | schema\n"
    "keys --long adds each field's type, allowed values, default and what it does; schema prints the config's JSON\n"
    "Schema (docs/config.schema.json).\n"
    "--preset ID replaces the model with a catalogue model (before --set is applied).\n"
    "--link LINK opens a link of the page: a whole URL (https://host/#memsim=3&...) or its fragment; quote it for the\n"
    "shell. A link that was cut off or altered exits 2 and says so; every field the link leaves out is its default.\n"
    "       memsim-cli validate DIR [--measured DIR]... [--residuals FILE]   (predicted against measured for every\n"
    "                                 case file in DIR, as markdown; each --measured folder of calibration runs gets a\n"
    "                                 section; --residuals writes the uncertainty band's table of DIR's errors)\n"
    "FILE may be - for standard input. KEY is a field's key, e.g. --set model.hidden_size=4096, or its bare name as\n"
    "links write it (hidden_size=4096).\n";

// A message as one terminal line: control characters (newlines, ESC sequences) escaped, and at most kMaxLineBytes,
// cut between UTF-8 characters, since messages quote what the user typed.
constexpr size_t kMaxLineBytes = 600;
std::string one_line(const std::string& message) {
  std::string out;
  for (unsigned char ch : message) {
    if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch < 0x20 || ch == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      out += hex;
    } else out += static_cast<char>(ch);
  }
  if (out.size() > kMaxLineBytes) {
    size_t cut = kMaxLineBytes;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    out = out.substr(0, cut) + "...";
  }
  return out;
}

int invalid(const std::string& message) {
  std::cerr << "memsim-cli: " << one_line(message) << "\n";
  return 2;
}

int invalid(const std::vector<FieldError>& errors) {
  if (errors.empty()) return invalid("the configuration could not be simulated");  // never expected; never a crash
  std::string msg = errors.front().message;
  if (errors.size() > 1) msg += " (and " + std::to_string(errors.size() - 1) + " more problems)";
  return invalid(msg);
}

// Reads at most `limit_bytes` + 1 bytes, so that a huge file or an endless stream (--config /dev/zero) is refused
// after that much, not after memory runs out. Configs, HF/DeepSpeed/Accelerate files and case files are a few KB
// (the decoders refuse more than 8 MiB); a file of sample lengths holds up to 10M numbers.
constexpr size_t kMaxConfigFileBytes = 8u << 20;
constexpr size_t kMaxLengthsFileBytes = 128u << 20;

bool read_input(const std::string& path, std::string& out, std::string& error, size_t limit_bytes = kMaxConfigFileBytes) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) {
      error = "cannot read " + path;
      return false;
    }
    in = &file;
  }
  out.clear();
  char chunk[1 << 16];
  while (out.size() <= limit_bytes && in->read(chunk, sizeof chunk).gcount() > 0)
    out.append(chunk, static_cast<size_t>(in->gcount()));
  if (out.size() > limit_bytes) {
    error = (path == "-" ? std::string("stdin") : path) + " is larger than " + std::to_string(limit_bytes >> 20) +
            " MiB, the most memsim reads";
    out.clear();
    return false;
  }
  return true;
}

// The uncertainty band (core/band.h): where each measured peak is expected, the headroom it asks for, and the
// published cases it comes from.
void print_band(const DeviceResult& d) {
  if (!d.band.valid) return;
  if (d.fixed_share) {  // core/result.h: the engine claims this share by design
    std::printf("  band: the engine's claimed share itself (vLLM takes gpu_memory_utilization of the GPU at start)\n");
    return;
  }
  std::printf("  band (where a measurement is expected, from the nearest published cases' errors):\n");
  for (int i = 0; i < kBandStatistics; ++i) {
    const auto s = static_cast<BandStatistic>(i);
    const StatisticBand& b = d.band.of(s);
    std::printf("    %-22s %14s - %s\n", band_statistic_id(s), format_bytes(b.low_bytes).c_str(),
                format_bytes(b.high_bytes).c_str());
  }
  std::printf("  keep %.1f%% of the GPU free above the prediction: the band's top (rather than the rule of thumb's "
              "10-15%%)\n", 100 * keep_free_fraction(d));
  // The device band's cases: the two that set its edges, then the nearest few (the page's tooltip lists them all).
  const StatisticBand& dev = d.band.of(BandStatistic::Device);
  if (dev.neighbours.empty()) return;
  auto named = [](const BandNeighbour& n) {
    char err[32];
    std::snprintf(err, sizeof err, "%+.1f%%", 100 * n.relative_error);
    return n.id + " (" + band_statistic_id(n.statistic) + " " + err + (n.excluded ? ", excluded" : "") + ")";
  };
  const auto [lo, hi] = std::minmax_element(dev.neighbours.begin(), dev.neighbours.end(),
                                            [](const auto& a, const auto& b) { return a.relative_error < b.relative_error; });
  std::printf("  device band from %zu published cases, errors from %s to %s; the nearest:",
              dev.neighbours.size(), named(*lo).c_str(), named(*hi).c_str());
  for (size_t i = 0; i < std::min<size_t>(5, dev.neighbours.size()); ++i)
    std::printf("%s %s", i ? "," : "", named(dev.neighbours[i]).c_str());
  std::printf("\n");
}

void print_table(const Result& r) {
  std::printf("parameters: %s (%s), trainable %s\n", format_count(r.params_total).c_str(),
              format_params(r.params_total).c_str(), format_count(r.params_trainable).c_str());
  std::printf("%s%s\n", describe_kept(r.model_states).c_str(),  // the breakdown's kept column (core/format.h)
              r.devices.size() > 1 ? (" (" + r.devices.front().role + ")").c_str() : "");
  for (const auto& d : r.devices) {
    std::printf("\n%s (x%lld): %s\n", d.role.c_str(), static_cast<long long>(d.device_count), verdict_words(d.verdict));
    if (!d.refusal.empty()) std::printf("  %s\n", d.refusal.c_str());
    std::printf("  %-24s %14s\n", "peak allocated", format_bytes(d.peak.allocated_bytes).c_str());
    std::printf("  %-24s %14s\n", "peak reserved", format_bytes(d.peak.reserved_bytes).c_str());
    std::printf("  %-24s %14s  of %s\n", "device (nvidia-smi)", format_bytes(d.peak.device_bytes).c_str(),
                describe_headroom(d).c_str());
    std::printf("  peak at: %s, %s\n", d.peak_phase.c_str(), d.peak_label.c_str());
    if (d.run.steps > 0) std::printf("  run: %s\n", describe_run(d.run).c_str());
    std::printf("  breakdown:                %14s %20s\n", kAtPeakWords, kKeptWords);
    for (const auto& row : breakdown_rows(d)) {
      if (row.absent) continue;
      const std::string label(row.label, std::min<size_t>(std::strlen(row.label), std::strcspn(row.label, "(")));
      std::printf("    %-22s %14s %20s\n", label.c_str(), format_bytes(row.at_peak_bytes).c_str(),
                  row.kept_bytes >= 0 ? format_bytes(row.kept_bytes).c_str() : "");
    }
    print_band(d);
  }
  if (r.host.per_node_bytes > 0 || r.host.nvme_per_node_bytes > 0) {
    std::printf("\nhost RAM per node (offloaded states of %lld GPUs): %s", static_cast<long long>(r.host.gpus_per_node),
                format_bytes(r.host.per_node_bytes).c_str());
    if (r.host.capacity_bytes > 0)
      std::printf(" of %s: %s", format_bytes(r.host.capacity_bytes).c_str(), r.host.fits ? "FITS" : "DOES NOT FIT");
    if (r.host.nvme_per_node_bytes > 0) std::printf("; on NVMe %s", format_bytes(r.host.nvme_per_node_bytes).c_str());
    std::printf("\n");
  }
  for (const auto& n : r.notes) std::printf("\nnote: %s\n", n.c_str());
}

void print_suggestions(const Config& config, const std::vector<Suggestion>& suggestions) {
  std::printf("\nwhat helps (each change simulated in full; device peak of the most loaded GPU):\n");
  if (suggestions.empty()) std::printf("  no change from the list lowers this setup's peak by 1%% or more\n");
  // The groups' headings, in advice.h's order.
  static const char* const kHeadings[kSuggestionGroups] = {
      "same job (same model, method, global batch and sequence)", "same job, slightly different numerics",
      "together they fit (no single change above fits)", "more hardware (GPUs of the same kind)",
      "changes the job"};
  int group = -1;
  for (const auto& s : suggestions) {
    if (static_cast<int>(s.group) != group) {
      group = static_cast<int>(s.group);
      std::printf(" %s:\n", kHeadings[group]);
    }
    std::printf("  %-58s saves %12s  -> %12s%s\n", s.change.c_str(), format_bytes(s.saved_bytes).c_str(),
                format_bytes(s.peak_bytes).c_str(),
                s.fits ? "  fits" : s.verdict == Verdict::Borderline ? "  borderline" : "");
    std::string sets;
    for (const auto& c : config_changes(config, s.config)) sets += " --set " + c;
    std::printf("    cost: %s\n    apply:%s\n", s.cost.c_str(), sets.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_heap_memory();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return invalid("usage: memsim-cli estimate|config|keys|presets|validate ... (memsim-cli --help says more)");
  if (args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args[0] == "validate") {
    if (args.size() < 2) return invalid("validate needs a folder of case files");
    auto load = [](const std::string& folder, std::vector<ValidationCase>& cases, std::string& err) {
      std::vector<std::string> files;
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
        if (entry.path().extension() == ".json") files.push_back(entry.path().string());
      if (ec) return err = "cannot read the folder " + folder, false;
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        std::string text;
        if (!read_input(f, text, err)) return false;
        ValidationCase vc;
        std::vector<FieldError> errors;
        if (!parse_validation_case(text, vc, errors)) return err = f + ": " + errors.front().message, false;
        cases.push_back(vc);
      }
      return true;
    };
    std::vector<ValidationCase> cases;
    std::string err;
    if (!load(args[1], cases, err)) return invalid(err);
    std::vector<std::string> measured_dirs;
    std::string residuals_file;
    for (size_t i = 2; i < args.size(); i += 2) {
      if ((args[i] != "--measured" && args[i] != "--residuals") || i + 1 >= args.size())
        return invalid("validate: expected --measured DIR or --residuals FILE, got " + args[i]);
      if (args[i] == "--measured") measured_dirs.push_back(args[i + 1]);
      else residuals_file = args[i + 1];
    }
    const ValidationSummary summary = run_validation(cases);
    std::string md = validation_markdown(summary);
    for (size_t i = 0; i < measured_dirs.size(); ++i) {
      if (i == 0)
        md += "\n## memsim's own calibration runs\n\n"
              "tools/calibrate ran each config for three training steps on the GPU named, and wrote every statistic "
              "to a `.jsonl` file beside these folders (`tests/validation/measured/`); `device` is NVML's used memory "
              "minus its reading before the run. Each folder holds one statistic's case files.\n\n";
      std::vector<ValidationCase> measured;
      if (!load(measured_dirs[i], measured, err)) return invalid(err);
      md += calibration_markdown(run_validation(measured), measured_dirs[i]);
    }
    if (!residuals_file.empty()) {  // the uncertainty band's table (core/band.h), from the published cases only
      std::ofstream out(residuals_file, std::ios::binary);
      out << residual_table_text(residual_rows(summary));
      if (!out) {  // not the input's fault: exit code 1
        std::cerr << "memsim-cli: validate: cannot write " << one_line(residuals_file) << "\n";
        return 1;
      }
    }
    std::cout << md;
    return 0;
  }
  if (args[0] == "presets") {  // the catalogue: id, name, parameters as published
    for (const auto& p : model_presets())
      std::printf("%-20s %-28s %s\n", p.id.c_str(), p.name.c_str(),
                  p.supported ? (p.params_published > 0 ? format_count(p.params_published).c_str() : "-")
                              : ("(not simulated: " + p.unsupported_reason + ")").c_str());
    return 0;
  }
  if (args[0] == "keys") {
    if (args.size() > 1 && args[1] != "--long") return invalid("keys takes --long or nothing; got \"" + args[1] + "\"");
    if (args.size() == 1) {
      for (const auto& k : field_keys()) std::puts(k.c_str());
      return 0;
    }
    for (const FieldDescription& d : field_descriptions())
      std::printf("%s\t%s\t%s\t%s\t%s\n", d.key.c_str(), d.type.c_str(), d.allowed.c_str(), d.default_value.c_str(),
                  d.help.c_str());
    return 0;
  }
  if (args[0] == "schema") {
    std::fputs(config_json_schema().c_str(), stdout);
    return 0;
  }
  const bool estimate = args[0] == "estimate";
  if (!estimate && args[0] != "config") return invalid("unknown command \"" + args[0] + "\"; try memsim-cli --help");

  Config config;
  std::string format = "json";
  bool timeline = false, with_suggestions = false;
  std::vector<std::string> sets;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= args.size()) return false;
      out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--config" || a == "--hf-config" || a == "--deepspeed-config" || a == "--accelerate-config") {
      if (!value(v)) return invalid(a + " needs a file name (or - for stdin)");
      std::string text, err;
      if (!read_input(v, text, err)) return invalid(err);
      Parsed p = a == "--config"              ? config_from_json(text, config)
                 : a == "--hf-config"         ? model_from_hf_json(text, config)
                 : a == "--accelerate-config" ? config_from_accelerate(text, config)
                                              : config_from_deepspeed_json(text, config);
      if (!p.ok) return invalid(p.errors);
      for (const auto& n : p.notes) std::cerr << "memsim-cli: note: " << one_line(n) << "\n";
      config = p.config;
    } else if (a == "--link") {
      // A link replaces the whole setup, as the page opens it; --set still applies after it.
      if (!value(v)) return invalid("--link needs a link (https://host/#memsim=3&...) or its fragment");
      Parsed p = config_from_fragment(v, config);
      if (!p.ok) return invalid(p.errors);
      config = p.config;
    } else if (a == "--lengths-file") {
      if (!value(v)) return invalid("--lengths-file needs a file name (or - for stdin)");
      std::string text, err;
      if (!read_input(v, text, err, kMaxLengthsFileBytes)) return invalid(err);
      SampleLengthsFile lengths;
      FieldError error;
      if (!sample_lengths_from_file(text, lengths, error)) return invalid("--lengths-file " + v + ": " + error.message);
      config.data.lengths = "samples";
      config.data.sample_lengths = lengths.sample_lengths;
      config.data.dataset_samples = lengths.samples;
      std::cerr << "memsim-cli: note: --lengths-file read " << lengths.samples << " sample lengths (" << lengths.shortest
                << " to " << lengths.longest << " tokens, median " << lengths.median
                << "); set data.lengths=samples, data.dataset_samples=" << lengths.samples
                << " and data.sample_lengths=" << lengths.sample_lengths << "\n";
    } else if (a == "--architecture") {
      // A model program (src/core/architecture.h): the file's JSON becomes model.architecture, compacted so that a
      // config or link carries it whole. Its errors name model.architecture and the place in the program.
      if (!value(v)) return invalid("--architecture needs a program file (or - for stdin)");
      std::string text, err;
      if (!read_input(v, text, err)) return invalid(err);
      config.model.architecture = compact_architecture(text);
      config.model.architecture_args.clear();
      config.model.name = "program from " + v;
    } else if (a == "--preset") {
      if (!value(v)) return invalid("--preset needs a model id (memsim-cli presets lists them)");
      const ModelPreset* p = find_model_preset(v);
      if (!p) return invalid("--preset: unknown model \"" + v + "\"; memsim-cli presets lists them");
      if (!p->supported) return invalid("--preset " + v + ": " + p->unsupported_reason);
      config.model = p->model;
    } else if (a == "--set") {
      if (!value(v)) return invalid("--set needs KEY=VALUE");
      sets.push_back(v);
    } else if (a == "--format") {
      if (!value(format) || (format != "json" && (estimate ? format != "table" : format != "fragment" && format != "deepspeed")))
        return invalid(std::string("--format must be json or ") + (estimate ? "table" : "fragment or deepspeed"));
    } else if (a == "--timeline") {
      timeline = true;
    } else if (a == "--suggest") {
      with_suggestions = true;
    } else {
      return invalid("unknown option \"" + a + "\"; try memsim-cli --help");
    }
  }
  for (const auto& s : sets) {  // after all files, so --set always wins
    auto errs = apply_setting(config, s);
    if (!errs.empty()) return invalid(errs);
  }
  if (!estimate) {  // print the normalised config: the memsim JSON or the link fragment
    // Only a config that simulates is written out: a link or a DeepSpeed file must not carry what memsim refuses.
    if (auto errors = validate(config); !errors.empty()) return invalid(errors);
    std::cout << (format == "json" ? config_to_json(config) : format == "deepspeed" ? deepspeed_json(config)
                                                                                   : config_to_fragment(config))
              << "\n";
    return 0;
  }
  Result r = simulate(config);
  if (!r.ok) return invalid(r.errors);
  std::vector<Suggestion> suggestions;
  if (with_suggestions) suggestions = suggest(config);
  if (format == "json") {
    std::cout << result_to_json(r, timeline, 2, with_suggestions ? &suggestions : nullptr, &config) << "\n";
  } else {
    print_table(r);
    if (with_suggestions) print_suggestions(config, suggestions);
  }
  return 0;
}
