#!/usr/bin/env bash
# Proves the release build and the release record; scripts/dev.sh test runs it.
#   1. RELEASES is well formed; each release has its CHANGELOG.md section
#      (and CHANGELOG.md an Unreleased one); each release's commit is in the
#      history of HEAD (when there is git history).
#   2. shard/LICENSE (the producer module's own copy) is LICENSE.
#   3. goreleaser check of .goreleaser.yaml.
#   4. goreleaser build --snapshot --single-target: this machine's target
#      built as a release is, whose --version must name the snapshot's
#      version and commit, statically linked and with -trimpath.
# goreleaser is installed with go install when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

GORELEASER_VERSION=v2.15.1 # v2.18+ needs a newer Go than go.mod's

log() { printf '==> release check: %s\n' "$*" >&2; }
fail() { printf 'release check: %s\n' "$*" >&2; exit 1; }

# 1. The record.
have_git=0
git rev-parse --verify -q HEAD >/dev/null 2>&1 && have_git=1
grep -q '^## \[Unreleased\]$' CHANGELOG.md || fail "CHANGELOG.md has no '## [Unreleased]' section"
newest=""
while read -r version commit date extra; do
	case "$version" in '' | '#'*) continue ;; esac
	[[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ && "$commit" =~ ^[0-9a-f]{40}$ &&
		"$date" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ && -z "$extra" ]] ||
		fail "RELEASES: line '$version $commit $date $extra' is not <vX.Y.Z> <40-hex commit> <YYYY-MM-DD>"
	grep -qxF "## [${version#v}] - $date" CHANGELOG.md ||
		fail "RELEASES lists $version of $date, CHANGELOG.md has no '## [${version#v}] - $date' section"
	if [ "$have_git" = 1 ]; then
		git cat-file -e "$commit^{commit}" 2>/dev/null ||
			fail "RELEASES: commit $commit of $version is not in this clone (shallow? git fetch --unshallow)"
		git merge-base --is-ancestor "$commit" HEAD ||
			fail "RELEASES: commit $commit of $version is not in the history of HEAD"
	fi
	[ -n "$newest" ] || newest="$version"
done <RELEASES
[ -n "$newest" ] || fail "RELEASES records no release"
first_section="$(grep -m1 -oE '^## \[[0-9]+\.[0-9]+\.[0-9]+[^]]*\]' CHANGELOG.md | sed 's/^## \[\(.*\)\]$/\1/')"
[ "v$first_section" = "$newest" ] ||
	fail "the newest release in CHANGELOG.md is $first_section, in RELEASES $newest: record it in both"
log "RELEASES and CHANGELOG.md agree; newest release $newest"

# 2. The producer module carries the licence itself (its module zip holds
# only shard/).
cmp -s LICENSE shard/LICENSE || fail "shard/LICENSE differs from LICENSE"

# 3. and 4. goreleaser.
gr="$(command -v goreleaser || true)"
[ -n "$gr" ] || gr="$(go env GOPATH)/bin/goreleaser"
if [ ! -x "$gr" ]; then
	log "installing goreleaser $GORELEASER_VERSION (go install; this takes a while the first time)"
	go install "github.com/goreleaser/goreleaser/v2@$GORELEASER_VERSION"
fi
log "goreleaser check ($("$gr" --version 2>/dev/null | sed -n 's/^GitVersion: *//p'))"
"$gr" check
if [ "$have_git" = 0 ]; then
	log "no git history: the snapshot build is left out (goreleaser versions a build by its commit)"
	exit 0
fi
# The clone may carry no tags: the snapshot follows the newest release
# recorded (.goreleaser.yaml's snapshot.version_template).
# goreleaser reads the commit only when the clone has a remote; one without
# (a local repository) gets one for this command only, through git's
# environment, without touching the repository's configuration.
if [ -z "$(git remote)" ]; then
	export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=remote.origin.url GIT_CONFIG_VALUE_0="$PWD"
fi
mkdir -p build
log "goreleaser build --snapshot --single-target"
GORELEASER_CURRENT_TAG="$newest" "$gr" build --snapshot --single-target --clean >/dev/null 2>build/goreleaser.log ||
	{ cat build/goreleaser.log >&2; fail "the snapshot build failed"; }
version="$(sed -n 's/.*"version":"\([^"]*\)".*/\1/p' dist/metadata.json)"
bin="$(grep -o '"path":"[^"]*/dispatcher"' dist/artifacts.json | head -1 | sed 's/"path":"\(.*\)"/\1/')"
[ -n "$version" ] && [ -x "$bin" ] || fail "no version in dist/metadata.json or no binary in dist/artifacts.json"
commit="$(git rev-parse HEAD | cut -c1-12)"
[ -z "$(git status --porcelain)" ] || commit="$commit+dirty"
want="dispatcher v$version (commit $commit of "
got="$("$bin" --version)"
case "$got" in "$want"*) ;; *) fail "$bin --version: '$got', want it to begin '$want'" ;; esac
info="$(go version -m "$bin")"
grep -q 'CGO_ENABLED=0' <<<"$info" || fail "$bin is not built with CGO_ENABLED=0"
grep -q -- '-trimpath=true' <<<"$info" || fail "$bin is not built with -trimpath"
log "snapshot $bin: $got"

# 5. Report only, asked for with RELEASE_CHECK_COMPARE=1 (CI's run stays
# short without it): the snapshot against the newest release, built from
# git by `dispatcher bench -compare`, one short pair of rate runs on the
# servers of DISPATCHER_REDIS_URL and DISPATCHER_AMQP_URL (default: local
# ones); RELEASE_CHECK_COMPARE_ARGS replaces the bench's flags. Its figures
# and its failures are printed, never judged: the check has passed above.
if [ "${RELEASE_CHECK_COMPARE:-0}" = 1 ]; then
	read -r -a compare_args <<<"${RELEASE_CHECK_COMPARE_ARGS:--mode rate -rate 1000 -shards 8 -duration 5s -compare-pairs 1}"
	log "comparison against $newest (report only): dispatcher bench -compare $newest ${compare_args[*]}"
	if "$bin" bench -compare "$newest" "${compare_args[@]}" 2>build/compare.log; then
		log "comparison against $newest done (progress in build/compare.log)"
	else
		code=$?
		tail -n 20 build/compare.log >&2
		log "comparison against $newest did not complete (exit $code, see build/compare.log): report only, the check passes"
	fi
fi
