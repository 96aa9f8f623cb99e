// Library versions as inputs. Users know which torch, transformers, peft and bitsandbytes they ran, not which
// tensors those versions keep; memsim derives its mechanism switches from the versions (frameworks.cpp resolve()).
//
// A library's version is "latest" (today's behaviour: exactly what memsim modelled before versions were inputs) or
// a release number such as "2.1" or "2.1.2". versions.date ("2023-10" or "2023-10-15") stands for the releases
// current at that date: each library left at latest takes its newest release dated on or before that day (a month
// alone means its first day), from the release tables in versions.cpp. A stated version always beats the date.
//
// The rules and their sources are in versions.cpp and frameworks.cpp; the research behind them is
// docs/versions.md (release tags, PR threads and release dates).
#pragma once
#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "validate.h"

namespace memsim {

// A release number. A missing part is 0: "2.1" is 2.1.0. Suffixes that pip shows after the number (a local build
// "+cu121", a pre-release "rc1", ".dev0", ".post1") are accepted and do not change the number: a release candidate
// or dev build of 4.46 carries the code of 4.46 that the rules look at.
struct Version {
  int major = 0, minor = 0, patch = 0;
  auto operator<=>(const Version&) const = default;
  bool operator==(const Version&) const = default;
};
std::string version_text(Version v);  // "2.1.0"

// A calendar day; "2023-10" is 2023-10-01.
struct Date {
  int year = 0, month = 0, day = 0;
  auto operator<=>(const Date&) const = default;
  bool operator==(const Date&) const = default;
};

enum class Library { Torch, Transformers, Peft, Bitsandbytes, Deepspeed, Torchao, FlashAttn, Torchtune, Unsloth, Trl, Vllm, Liger };
constexpr size_t kLibraryCount = 12;

struct Release {
  Version version;
  Date date;
};

struct LibraryInfo {
  Library library;
  std::string_view name;   // as pip names it: "torch", "flash-attn"
  std::string_view field;  // "versions.torch"
  std::span<const Release> releases;  // oldest first; empty where memsim has no table
  std::string_view releases_source;
  // The switches this library's version sets, for the page and the docs ("" where none does yet).
  std::string_view sets;
};
std::span<const LibraryInfo> libraries();
const LibraryInfo& library_info(Library lib);
std::string& version_field(VersionsConfig& v, Library lib);
const std::string& version_field(const VersionsConfig& v, Library lib);

// What one library's version is for the rules.
struct LibraryVersion {
  bool latest = true;       // no version stated and none from the date: today's behaviour
  Version version;          // when !latest
  bool from_date = false;   // taken from the release table by versions.date
  // True when the date precedes every release in the table: the oldest one known stands in. The rules' boundaries
  // all lie after the first release of each table, so every older version sets the switches the same way.
  bool before_table = false;
  // A nightly build stated with its build date ("2.1.0.dev20230623", as torch's nightlies print it): built from the
  // main branch that day, it holds what was merged by then, so the newest release of the table before that date
  // stands in for it (the rules are keyed to releases, not merge dates); `version` is that release.
  bool nightly = false;
  Date built;  // the nightly's date
};
struct StackVersions {
  LibraryVersion lib[kLibraryCount];
  Date date;  // versions.date, if given
  bool has_date = false;
  const LibraryVersion& operator[](Library l) const { return lib[static_cast<size_t>(l)]; }
  // Whether the library's version is below `v`; "latest" is above every version.
  bool below(Library l, Version v) const;
  bool at_least(Library l, Version v) const { return !below(l, v); }
  bool stated(Library l) const { return !(*this)[l].latest; }
};

// Parsing; std::nullopt-like failures return false. Neither accepts "latest" or empty text.
bool parse_version(std::string_view text, Version& out);
bool parse_date(std::string_view text, Date& out);

// Field errors for the versions section ("versions.torch must be a version such as 2.1 or 2.1.2, or latest; got ...").
void validate_versions(const VersionsConfig& v, std::vector<FieldError>& errors);

// Every library's version for the rules. Requires a validated section; a bad entry reads as latest.
StackVersions stack_versions(const VersionsConfig& v);

// "torch 1.10.0", "torch 2.0.1 (current at versions.date 2023-10-01)", "torch latest".
std::string describe_version(const StackVersions& s, Library lib);

}  // namespace memsim
