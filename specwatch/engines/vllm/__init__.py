"""vLLM: its log grammar, its HTTP API, its launch command line, the facts read from its installed
source, the probes run against them and its collapse advice."""
