#!/bin/sh
# Install specwatch as a systemd service:
#   venv in /opt/specwatch, config in /etc/specwatch, unit in /etc/systemd/system, enabled and
#   started, `specwatch` on PATH (/usr/local/bin). Re-running upgrades the venv and the unit; an
#   existing config is never overwritten.
#
# usage: deploy/install.sh [--root DIR] [--dry-run] [--no-enable]
#                          [--venv-args ARGS] [--pip-args ARGS] [SOURCE]
#   SOURCE         what pip installs: this checkout (default), a wheel, or a requirement
#   --root DIR     stage everything under DIR instead of / (packaging, tests); nothing is enabled,
#                  and the venv's scripts point into DIR, so copy DIR's tree to no other place
#   --dry-run      print the commands, change nothing
#   --no-enable    install only; do not run systemctl
#   --venv-args    extra arguments for `python3 -m venv` (e.g. --system-site-packages)
#   --pip-args     extra arguments for `pip install` (e.g. --no-index --find-links DIR offline)
# Environment: PYTHON (default: the first python3 >= 3.11 outside /home and /root).
#
# Each install is a new venv, /opt/specwatch.d/STAMP; /opt/specwatch is a symlink to it, switched
# only once the venv is built and the config validates with the new code (a failed upgrade
# leaves the running install as it was). The previous venv is kept, and any a process still runs
# (a daemon runs its venv until `systemctl restart specwatch`); older ones are removed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src_dir=$(dirname "$here")
root=/
dry_run=0
enable=1
venv_args=
pip_args=
source=$src_dir
python=${PYTHON:-}

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; }

while [ $# -gt 0 ]; do
  case $1 in
    --root) root=${2:?--root needs a directory}; shift 2 ;;
    --root=*) root=${1#*=}; shift ;;
    --dry-run) dry_run=1; shift ;;
    --no-enable) enable=0; shift ;;
    --venv-args) venv_args=${2?}; shift 2 ;;
    --venv-args=*) venv_args=${1#*=}; shift ;;
    --pip-args) pip_args=${2?}; shift 2 ;;
    --pip-args=*) pip_args=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) source=$1; shift ;;
  esac
done

root=${root%/}
venv=$root/opt/specwatch
releases=$root/opt/specwatch.d
new=$releases/$(date -u +%Y%m%dT%H%M%SZ)-$$
etc=$root/etc/specwatch
unit_dir=$root/etc/systemd/system
bin_link=$root/usr/local/bin/specwatch

# Print a command; run it unless --dry-run. Word splitting of $venv_args/$pip_args is wanted.
run() {
  echo "+ $*"
  if [ "$dry_run" = 0 ]; then "$@"; fi
}

# The unit has ProtectHome=yes: an interpreter (or its standard library) under /home, /root or
# /run/user is invisible to the service, which then fails with status 203/EXEC, restarting.
# Prints where PYTHON's files are; exit 1 below 3.11, 3 when they are hidden from the unit.
python_home() {
  "$1" -c 'import os, sys
where = [os.path.realpath(p) for p in (sys.executable, sys.base_prefix)]
print(" ".join(where))
if sys.version_info < (3, 11): sys.exit(1)
sys.exit(3 if any(p == h or p.startswith(h + "/") for p in where for h in ("/home", "/root", "/run/user")) else 0)' 2>/dev/null
}

if [ -z "$python" ]; then
  for p in python3 /usr/local/bin/python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && python_home "$p" >/dev/null; then python=$p; break; fi
  done
  if [ -z "$python" ]; then
    echo "install.sh: no python3 >= 3.11 outside /home and /root (the unit cannot see those: ProtectHome=yes);" \
      "install one (Debian 12: apt install python3 python3-venv) or set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
fi
rc=0; where=$(python_home "$python") || rc=$?
if [ "$rc" = 3 ] && [ "$root" = "" ]; then
  echo "install.sh: $python lives under /home or /root ($where): the unit's ProtectHome=yes hides it" \
    "from the service (it would fail with status 203/EXEC); use a Python outside them, e.g." \
    "PYTHON=/usr/bin/python3 (Debian 12: apt install python3-venv)" >&2
  exit 1
elif [ "$rc" = 3 ]; then
  echo "  note: $python is under /home or /root: fine for staging, hidden from the unit on a host"
elif [ "$rc" != 0 ]; then
  echo "install.sh: $python is not a Python >= 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1
fi

# Until the new venv is in place, a failure removes it and leaves the installed one as it was.
if [ "$dry_run" = 0 ]; then trap 'rm -rf "$new"' EXIT; fi
run install -d -m 0755 "$releases"
# shellcheck disable=SC2086
run "$python" -m venv $venv_args "$new"
# shellcheck disable=SC2086
run "$new/bin/python" -m pip install --quiet --disable-pip-version-check $pip_args "$source"
# The unit's Documentation= and the Prometheus/Grafana files, next to the code they match.
run install -d -m 0755 "$new/share"
run install -m 0644 "$src_dir/README.md" "$new/share/README.md"
run cp -R "$src_dir/deploy/prometheus" "$new/share/"
if [ -d "$src_dir/grafana" ]; then run cp -R "$src_dir/grafana" "$new/share/"; fi

run install -d -m 0755 "$etc"
if [ -e "$etc/config.yaml" ]; then
  echo "  keeping $etc/config.yaml"
else
  run install -m 0644 "$src_dir/config.example.yaml" "$etc/config.yaml"
fi
# Secrets (SPECWATCH_SLACK_WEBHOOK_URL=...) for `webhook_url_env:`; read by systemd as root.
if [ ! -e "$etc/environment" ]; then
  run install -m 0600 /dev/null "$etc/environment"
  if [ "$dry_run" = 0 ]; then
    printf '%s\n' '# KEY=value lines for specwatch; keep this file mode 0600.' \
      '# SPECWATCH_SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T000/B000/XXXX' > "$etc/environment"
  fi
fi
# The new code validates the config, with the secrets the unit gives it.
run "$new/bin/specwatch" check-config --env-file "$etc/environment" "$etc/config.yaml"

# Switch /opt/specwatch to the new venv in one rename. An install from before this layout (a
# directory there) is moved into $releases first.
previous=
if [ -L "$venv" ]; then
  previous=$(readlink "$venv")
elif [ -d "$venv" ]; then
  previous=$(basename "$new")-before
  run mv "$venv" "$releases/$previous"
fi
run ln -sfn "specwatch.d/$(basename "$new")" "$venv.link"
run mv -T "$venv.link" "$venv"
if [ "$dry_run" = 0 ]; then trap - EXIT; fi
# Older venvs go, but the previous one and any a running process was started from (a daemon not
# restarted since an earlier upgrade).
for old in "$releases"/*; do
  case $old in "$new"|"$releases/${previous#specwatch.d/}"|"$releases/*") continue ;; esac
  if grep -qsF "$old/bin/" /proc/[0-9]*/cmdline; then echo "  keeping $old (still running)"; continue; fi
  run rm -rf "$old"
done

# `specwatch` in a shell: a symlink to the venv's, unless something else is there.
if [ -L "$bin_link" ] || [ ! -e "$bin_link" ]; then
  run install -d -m 0755 "$(dirname "$bin_link")"
  run ln -sfn "$venv/bin/specwatch" "$bin_link"
else
  echo "  keeping $bin_link (not a symlink: another install); this one is $venv/bin/specwatch"
fi

run install -d -m 0755 "$unit_dir"
run install -m 0644 "$here/specwatch.service" "$unit_dir/specwatch.service"

# The next step depends on what runs now: start a service that is not running, reload (SIGHUP)
# one that is, restart one that ran the code this install replaced.
edit="edit $etc/config.yaml (logs[].path, server, alerts.slack)"
if [ "$root" != "" ]; then
  echo "installed under $root; not enabled."
  echo "next: nothing runs from $root (a venv is not relocatable): on the host, run deploy/install.sh" \
    "without --root; it enables and starts the service and says what comes next"
elif [ "$enable" = 0 ] || { [ "$dry_run" = 0 ] && [ ! -d /run/systemd/system ]; }; then
  if [ "$enable" = 0 ]; then echo "installed; not enabled (--no-enable)."; else echo "systemd is not running here."; fi
  echo "next: $edit, then: systemctl daemon-reload && systemctl enable --now specwatch.service"
else
  was_active=0
  if systemctl is-active --quiet specwatch.service 2>/dev/null; then was_active=1; fi
  run systemctl daemon-reload
  run systemctl enable --now specwatch.service
  echo "check: systemctl status specwatch; curl -s localhost:9849/metrics | head"
  if [ "$was_active" = 1 ]; then
    echo "next: systemctl restart specwatch (it was already running: the upgraded code runs after a restart);" \
      "after editing $etc/config.yaml: systemctl reload specwatch"
  elif [ "$dry_run" = 0 ] && ! systemctl is-active --quiet specwatch.service; then
    echo "next: it did not start (journalctl -u specwatch): $edit, then: systemctl restart specwatch"
  else
    echo "next: it runs with the example config now: $edit, then: systemctl reload specwatch" \
      "(restart instead after editing $etc/environment: systemd reads it at start only)"
  fi
fi
