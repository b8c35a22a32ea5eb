// A daemon's settings as data: one list per config struct, in the job_spec_fields.h style,
// from which everything that names a setting derives:
//   - the YAML reader (settings_yaml.h: known keys, their types, "unknown setting" errors),
//   - the command-line flags (settings_cli.h: one flag per setting, applied only when given),
//   - the per-field checks (CheckSettings, below: ranges, required values),
//   - the defaults column of the docs' table (DefaultText, below; a test holds the docs to it).
// Cross-field rules (lost_after_s >= heartbeat_timeout_s, a port range's order, TLS pairs)
// stay hand-written in the component's Validate.
//
// A list is a functor `template <class V> void operator()(V& v) const` calling
// `v.Field(Setting(...)..., &Config::member)` once per setting, in the docs' order. Members are
// std::string, double, int64_t, int, bool, std::vector<std::string> or std::vector<int64_t>.
//
// Adding a setting: the member (with its default and doc) in the config struct, ONE line in its
// list, and a row in the docs' table (the docs test names a missing or stale row).
#ifndef ULYSSES_COMMON_CONFIG_SETTINGS_H_
#define ULYSSES_COMMON_CONFIG_SETTINGS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace ulysses::config {

// How a value is shown in the docs' default column.
enum class Unit { kPlain, kBytes };

// One setting: its key, flag, help, allowed range and how its default is shown.
struct Setting {
  explicit Setting(std::string k) : key(std::move(k)) {}

  std::string key;   // YAML key, and the name in messages.
  std::string flag;  // "--key-with-dashes" unless set by Flag(); "" = no flag (YAML only).
  std::string help;  // The flag's --help line.
  // Numbers: allowed values lo..hi (lo excluded when lo_open), and 0 besides when zero_ok.
  bool bounded = false;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool zero_ok = false;
  std::string fix;            // The "(use ...)" of an out-of-range or missing value.
  bool required = false;      // Strings: must not be empty.
  std::string shown_default;  // The docs' default when the value alone does not say it.
  Unit unit = Unit::kPlain;

  Setting& Flag(std::string f) {
    flag = std::move(f);
    has_flag_override = true;
    return *this;
  }
  Setting& NoFlag() { return Flag(""); }
  Setting& Help(std::string h) {
    help = std::move(h);
    return *this;
  }
  // lo <= value <= hi.
  Setting& In(double l, double h) {
    bounded = true;
    lo = l;
    hi = h;
    return *this;
  }
  // lo < value <= hi.
  Setting& Above(double l, double h) {
    In(l, h);
    lo_open = true;
    return *this;
  }
  // 0 is allowed besides the range (it means off, or a derived default).
  Setting& OrZero() {
    zero_ok = true;
    return *this;
  }
  Setting& Fix(std::string f) {
    fix = std::move(f);
    return *this;
  }
  Setting& Required(std::string f) {
    required = true;
    fix = std::move(f);
    return *this;
  }
  Setting& Shown(std::string d) {
    shown_default = std::move(d);
    return *this;
  }
  Setting& Bytes() {
    unit = Unit::kBytes;
    return *this;
  }

  // The flag name: Flag()'s, else "--" and the key with dashes.
  std::string FlagName() const {
    if (has_flag_override) return flag;
    return absl::StrCat("--", absl::StrReplaceAll(key, {{"_", "-"}}));
  }
  // The first of FlagName()'s names ("--devices" of "--devices,--device"): messages and docs.
  std::string PrimaryFlag() const {
    const std::string all = FlagName();
    return all.substr(0, all.find(','));
  }

 private:
  bool has_flag_override = false;
};

// "8 MiB", "4 GiB", "65536" (bytes not a whole number of KiB/MiB/GiB stay plain).
inline std::string BytesText(int64_t v) {
  constexpr int64_t kKiB = 1024;
  const char* units[] = {"GiB", "MiB", "KiB"};
  const int64_t sizes[] = {kKiB * kKiB * kKiB, kKiB * kKiB, kKiB};
  for (int i = 0; i < 3; ++i) {
    if (v != 0 && v % sizes[i] == 0) return absl::StrCat(v / sizes[i], " ", units[i]);
  }
  return absl::StrCat(v);
}

// A value as the docs' default column shows it.
inline std::string ValueText(const std::string& v, Unit) {
  return v.empty() ? "(none)" : absl::StrCat("`", v, "`");
}
inline std::string ValueText(bool v, Unit) { return v ? "true" : "false"; }
template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string ValueText(T v, Unit unit) {
  if (unit == Unit::kBytes) return BytesText(static_cast<int64_t>(v));
  return absl::StrCat(v);
}
template <class T>
std::string ValueText(const std::vector<T>& v, Unit) {
  return absl::StrCat("`[", absl::StrJoin(v, ", "), "]`");
}

// The docs' default column of one setting: Shown()'s text, "(required)" for a required
// setting without a default, or the value.
template <class T>
std::string DefaultText(const Setting& s, const T& value) {
  if (!s.shown_default.empty()) return s.shown_default;
  std::string text = ValueText(value, s.unit);
  if (s.required && text == "(none)") return "(required)";
  return text;
}

namespace internal {

template <class T>
constexpr bool kIsNumber = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

// `<key>: <value> is out of range (use <fix>)` when a bounded number is outside its range.
template <class T>
void CheckOne(const Setting& s, const std::string& name, const T& v,
              std::vector<std::string>* errors) {
  if constexpr (kIsNumber<T>) {
    if (!s.bounded) return;
    const double x = static_cast<double>(v);
    const bool in_range = std::isfinite(x) && (s.lo_open ? x > s.lo : x >= s.lo) && x <= s.hi;
    if (in_range || (s.zero_ok && x == 0)) return;
    errors->push_back(absl::StrCat(name, ": ", v, " is out of range (use ", s.fix, ")"));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (s.required && v.empty()) errors->push_back(absl::StrCat(name, ": empty (", s.fix, ")"));
  }
}

template <class C>
struct Checker {
  const C& config;
  bool by_flag;
  std::vector<std::string>* errors;
  template <class T>
  void Field(const Setting& s, T C::*member) {
    const std::string name = by_flag && !s.FlagName().empty() ? s.PrimaryFlag() : s.key;
    CheckOne(s, name, config.*member, errors);
  }
};

template <class C>
struct Rows {
  C defaults;
  std::vector<std::pair<std::string, std::string>>* rows;
  bool by_flag;
  template <class T>
  void Field(const Setting& s, T C::*member) {
    rows->emplace_back(by_flag ? s.PrimaryFlag() : s.key, DefaultText(s, defaults.*member));
  }
};

}  // namespace internal

// Appends one line per setting of `list` whose value in `config` breaks its own range or
// requirement, named by key (or by flag when by_flag: a daemon configured by flags only).
template <class C, class List>
void CheckSettings(const C& config, const List& list, std::vector<std::string>* errors,
                   bool by_flag = false) {
  internal::Checker<C> checker{config, by_flag, errors};
  list(checker);
}

// (key or flag, default column) for every setting of `list`, in its order, from C{}'s values.
template <class C, class List>
std::vector<std::pair<std::string, std::string>> DefaultsTable(const List& list,
                                                               bool by_flag = false) {
  std::vector<std::pair<std::string, std::string>> rows;
  internal::Rows<C> visitor{C{}, &rows, by_flag};
  list(visitor);
  return rows;
}

}  // namespace ulysses::config

#endif  // ULYSSES_COMMON_CONFIG_SETTINGS_H_
