#!/usr/bin/env bash
# nginx for `distrinews serve-replicas`: nothing to do where it is installed; Debian's nginx-light where apt-get
# may install it (root, or sudo without a password); otherwise one line that says how, and exit 1.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    SUDO=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "nginx is not installed: run 'sudo apt-get install nginx-light' (or pass --nginx PATH to distrinews serve-replicas)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  ($SUDO apt-get install -y -qq nginx-light >/dev/null 2>&1 || ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq nginx-light >/dev/null)) && exit 0
fi
echo "nginx is not installed and could not be installed here: install nginx (Debian/Ubuntu: apt-get install nginx-light), or pass --nginx PATH" >&2
exit 1
