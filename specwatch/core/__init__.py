"""The core every path shares: the events a source's lines become (`events`), the pipeline that
feeds them to the rules (`pipeline`), the log clock and its zone (`logclock`), a rule's faults
(`rulefaults`), the families the log path exports (`metrics`), and the building blocks of the
config sections (`sections`). It imports the sources, the rules and the engines' registry, never
the wiring above it (daemon, replay, cli, config, alerting)."""
