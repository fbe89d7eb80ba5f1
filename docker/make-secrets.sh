#!/bin/sh
# Makes the demo's secrets once, before the first `docker compose up`:
#   sh docker/make-secrets.sh
# Random, mode 0600, never committed (secrets/.gitignore). Compose bind-mounts
# secret files with the host file's mode (its uid/gid/mode options do nothing
# outside Swarm), and jobs run as `nobody` inside the worker containers: a
# world-readable key file would be readable by every job.
# Files that exist are kept, so a rerun never changes a running cluster's keys.
set -eu
umask 077
dir="${1:-$(dirname "$0")/secrets}"
mkdir -p "$dir"

random() {
  od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}

keep_or_make() {
  [ -s "$dir/$1" ] || random > "$dir/$1"
}

keep_or_make etcd-password       # the agents' etcd user, `etcdsched`
keep_or_make etcd-root-password  # etcd's root: only the etcd-auth step uses it
keep_or_make s3-access-key       # the agents' S3 identity in SeaweedFS
keep_or_make s3-secret-key

# SeaweedFS reads its S3 identities from this file (-s3.config). The one
# identity may read, write and list the log bucket and nothing else: it
# cannot create or delete buckets (docs/operations.md, "Log store").
if [ ! -s "$dir/seaweedfs-s3.json" ]; then
  bucket="${ETCDSCHED_DEMO_BUCKET:-etcdsched-logs}"
  cat > "$dir/seaweedfs-s3.json" <<JSON
{
  "identities": [
    {
      "name": "etcdsched",
      "credentials": [
        {"accessKey": "$(cat "$dir/s3-access-key")", "secretKey": "$(cat "$dir/s3-secret-key")"}
      ],
      "actions": ["Read:$bucket", "Write:$bucket", "List:$bucket"]
    }
  ]
}
JSON
fi
echo "secrets in $dir"
