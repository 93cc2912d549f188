#!/bin/sh
# Install specwatch as a systemd service:
#   venv in /opt/specwatch, config in /etc/specwatch, unit in /etc/systemd/system, enabled and
#   started. Re-running upgrades the venv and the unit; an existing config is never overwritten.
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
# Environment: PYTHON (default python3, must be >= 3.11).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src_dir=$(dirname "$here")
root=/
dry_run=0
enable=1
venv_args=
pip_args=
source=$src_dir
python=${PYTHON:-python3}

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }

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
etc=$root/etc/specwatch
unit_dir=$root/etc/systemd/system

# Print a command; run it unless --dry-run. Word splitting of $venv_args/$pip_args is wanted.
run() {
  echo "+ $*"
  if [ "$dry_run" = 0 ]; then "$@"; fi
}

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "install.sh: $python is older than 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }

# shellcheck disable=SC2086
run "$python" -m venv $venv_args "$venv"
# shellcheck disable=SC2086
run "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pip_args "$source"
# The unit's Documentation= and the Prometheus/Grafana files, next to the code they match.
run install -d -m 0755 "$venv/share"
run install -m 0644 "$src_dir/README.md" "$venv/share/README.md"
run cp -R "$src_dir/deploy/prometheus" "$venv/share/"
if [ -d "$src_dir/grafana" ]; then run cp -R "$src_dir/grafana" "$venv/share/"; fi

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
run "$venv/bin/specwatch" check-config "$etc/config.yaml"

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
    echo "next: it runs with the example config now: $edit, then: systemctl reload specwatch"
  fi
fi
