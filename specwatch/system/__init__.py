"""What specwatch needs of the operating system, apart from what it watches: systemd's notify
socket (`sdnotify`), the `/metrics` listener and its rendering (`exposition`), child processes that end with their parent
(`childproc`), the state directory (`storage`), YAML read with limits (`safe_yaml`), the unit's
environment file (`envfile`) and `ast` behind a process-wide lock (`pyast`). Nothing here knows
about engines, rules or alerts."""
