#!/usr/bin/env bash
# Writes to FILE the licence and notice texts of everything linked into
# the dispatcher binary besides the project's own code: the Go standard
# library and each third-party module, for the release archives and image
# (.goreleaser.yaml runs it before the build). A module without a licence
# file fails the script: a release must not ship code of unknown terms.
#   scripts/third-party-licenses.sh FILE
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: $0 FILE}"
mkdir -p "$(dirname "$out")"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT

# Every module a released target links (the platforms' dependencies can
# differ), without the main module and modules replaced by a directory of
# this repository (shard/, under the project's LICENSE).
mods="$(for os in linux darwin; do for arch in amd64 arm64; do
	GOOS=$os GOARCH=$arch CGO_ENABLED=0 go list -deps \
		-f '{{with .Module}}{{if and (not .Main) (not .Replace)}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' ./cmd/dispatcher
done; done | sort -u)"

section() { # title, files...
	local title="$1"; shift
	printf '%s\n%s\n' "================================================================================" "$title"
	for f in "$@"; do
		printf -- '-------- %s --------\n' "$(basename "$f")"
		cat "$f"
		printf '\n'
	done
}

{
	printf 'dispatcher links the following third-party software; each is under its own licence, given here.\n\n'
	goroot="$(go env GOROOT)"
	section "The Go standard library and runtime ($(go env GOVERSION))" "$goroot/LICENSE"
	while read -r path version dir; do
		[ -n "$path" ] || continue
		[ -n "$dir" ] || { echo "$0: module $path $version is not in the module cache (go mod download)" >&2; exit 1; }
		mapfile -t files < <(find "$dir" -maxdepth 1 -type f \( -iname 'LICEN[CS]E*' -o -iname 'COPYING*' -o -iname 'NOTICE*' \) | sort)
		if [ "${#files[@]}" = 0 ]; then
			echo "$0: module $path $version has no LICENSE, COPYING or NOTICE file in $dir" >&2
			exit 1
		fi
		section "$path $version" "${files[@]}"
	done <<<"$mods"
} >"$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "$0: $(grep -c '^================' "$out") sections written to $out" >&2
