"""Pure configuration vocabulary shared by `splatq.shared.settings` and the engine: names,
defaults and string parsers, with no dependency on either (both import from here)."""
