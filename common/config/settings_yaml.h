// The YAML reader of a settings list (settings.h): a mapping of keys to values, each key a
// setting of the list or one of the caller's sections; anything else is an error naming the key
// and the known ones. Keys not present keep their current value.
#ifndef ULYSSES_COMMON_CONFIG_SETTINGS_YAML_H_
#define ULYSSES_COMMON_CONFIG_SETTINGS_YAML_H_

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/settings.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::config {

// A section's own reader (a nested mapping such as `quotas:`): returns its error lines, each
// already `<field>: <value> <problem> (<fix>)` below the section.
using SectionReader = std::function<std::vector<std::string>(const YAML::Node&)>;

namespace internal {

template <class C>
struct YamlSetters {
  C* config;
  std::map<std::string, std::function<void(const YAML::Node&)>>* setters;
  template <class T>
  void Field(const Setting& s, T C::*member) {
    C* c = config;
    (*setters)[s.key] = [c, member](const YAML::Node& n) { c->*member = n.as<T>(); };
  }
};

}  // namespace internal

// Reads the mapping `root` into `config` through `list`, and each of `sections`' keys through
// its reader. Appends `<prefix><key>: ...` lines to `errors`, one per problem.
template <class C, class List>
void ReadSettingsYaml(const YAML::Node& root, const List& list,
                      const std::map<std::string, SectionReader>& sections,
                      const std::string& prefix, C* config, std::vector<std::string>* errors) {
  std::map<std::string, std::function<void(const YAML::Node&)>> setters;
  internal::YamlSetters<C> visitor{config, &setters};
  list(visitor);
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (auto section = sections.find(key); section != sections.end()) {
      for (const std::string& line : section->second(kv.second)) {
        errors->push_back(absl::StrCat(prefix, line));
      }
      continue;
    }
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::vector<std::string> known;
      for (const auto& s : setters) known.push_back(s.first);
      for (const auto& s : sections) known.push_back(s.first);
      std::sort(known.begin(), known.end());
      errors->push_back(
          absl::StrCat(prefix, key, ": unknown setting (known: ", absl::StrJoin(known, ", "), ")"));
      continue;
    }
    try {
      it->second(kv.second);
    } catch (const std::exception& e) {
      errors->push_back(absl::StrCat(prefix, key, ": ", YAML::Dump(kv.second),
                                     " has the wrong type (", e.what(), ")"));
    }
  }
}

}  // namespace ulysses::config

#endif  // ULYSSES_COMMON_CONFIG_SETTINGS_YAML_H_
