#!/bin/sh
# Turns etcd authentication on, once (docs/security.md, "Deploying with an
# external etcd"): without it, anything that reaches etcd's client port (a
# job on a worker, the sample app) could write a token with the admin role.
# The agents then connect as user `etcdsched`, whose role reads and writes
# under the key prefix and nothing else. Every step tolerates having been
# done, so a run cut short finishes on the next `up`.
set -eu
endpoints="${ETCDSCHED_ETCD:?}"
prefix="${ETCDSCHED_PREFIX:-/etcdsched/}"
password_file="${ETCDSCHED_ETCD_PASSWORD_FILE:?}"
root_password_file="${ETCD_ROOT_PASSWORD_FILE:?}"
ctl() { etcdctl --endpoints "$endpoints" --dial-timeout=5s --command-timeout=10s "$@"; }

# An anonymous read tells: it works (auth off), or is refused (auth on).
if ! probe=$(ctl get --keys-only --limit=1 / 2>&1); then
  if echo "$probe" | grep -q 'user name is empty'; then
    echo "etcd authentication is on already"
    exit 0
  fi
  echo "cannot reach etcd at $endpoints: $probe" >&2
  exit 1
fi
tolerate() {  # etcdctl "... already exists" means done by an earlier run
  out=$("$@" 2>&1) || echo "$out" | grep -q 'already exists' || { echo "$out" >&2; exit 1; }
}
tolerate ctl role add etcdsched
ctl role grant-permission --prefix=true etcdsched readwrite "$prefix"
tolerate ctl user add etcdsched --interactive=false < "$password_file"
ctl user grant-role etcdsched etcdsched
tolerate ctl user add root --interactive=false < "$root_password_file"
ctl user grant-role root root
ctl auth enable
echo "etcd authentication enabled; agents connect as etcdsched"
