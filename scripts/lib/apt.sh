# shellcheck shell=bash
# Sourced by the scripts that install Debian packages.
#   apt_install PACKAGE...   installs them (as root, or with sudo), after one
#                            `apt-get update` per script run.
if [ "$(id -u)" -eq 0 ]; then apt_sudo=""; else apt_sudo="sudo"; fi
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    timeout 600 $apt_sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 1800 $apt_sudo apt-get install -y -qq "$@" >/dev/null
}
