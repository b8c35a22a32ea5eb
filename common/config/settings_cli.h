// The command-line flags of a settings list (settings.h): one CLI11 option per setting with a
// flag, whose --help line ends with the default. A flag overrides its setting only when given
// (no sentinel values), after the config file was read.
#ifndef ULYSSES_COMMON_CONFIG_SETTINGS_CLI_H_
#define ULYSSES_COMMON_CONFIG_SETTINGS_CLI_H_

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config/settings.h"

namespace ulysses::config {

template <class C>
class FlagOverrides {
 public:
  // Adds `list`'s flags to `app`. `this` must outlive the parse and ApplyTo.
  template <class List>
  void AddTo(CLI::App& app, const List& list) {
    Binder binder{&app, this, C{}};
    list(binder);
  }

  // Sets each setting whose flag was given on the command line.
  void ApplyTo(C* config) const {
    for (const auto& apply : appliers_) apply(config);
  }

 private:
  struct Binder {
    CLI::App* app;
    FlagOverrides* self;
    C defaults;
    template <class T>
    void Field(const Setting& s, T C::*member) {
      if (s.FlagName().empty()) return;
      auto value = std::make_shared<T>(defaults.*member);
      const std::string shown = absl::StrReplaceAll(DefaultText(s, defaults.*member), {{"`", ""}});
      std::string help = s.help;
      if (shown.front() == '(') {
        if (shown != "(none)") absl::StrAppend(&help, " ", shown);  // "(required)".
      } else {
        absl::StrAppend(&help, " (default: ", shown, ")");
      }
      CLI::Option* option = nullptr;
      if constexpr (std::is_same_v<T, bool>) {
        option = app->add_flag(s.FlagName(), *value, help);
      } else {
        option = app->add_option(s.FlagName(), *value, help);
      }
      self->appliers_.push_back([option, value, member](C* c) {
        if (option->count() > 0) c->*member = *value;
      });
    }
  };

  std::vector<std::function<void(C*)>> appliers_;
};

}  // namespace ulysses::config

#endif  // ULYSSES_COMMON_CONFIG_SETTINGS_CLI_H_
