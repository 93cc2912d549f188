"""SGLang: its log grammar, its launch command line (`settings`), the facts read from its installed
source (`source`, `facts`) and the table used when none can be read (`known_versions`)."""
