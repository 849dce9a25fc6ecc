# make demo | demo-hooks | demo-docker | check | test | fuzz | bench | build | release | deb | clean-containerd — see
# scripts/*.sh
.PHONY: demo demo-hooks demo-docker check test fuzz bench build release deb clean-containerd

# runtime-proxy with the example hook, then runtime-proxy with runtime-hooks (proxy and standalone mode),
# then runtime-proxy in Docker mode in front of dockerd
demo:
	@scripts/demo.sh
	@scripts/demo-hooks.sh
	@scripts/demo-docker.sh

demo-docker:
	@scripts/demo-docker.sh

demo-hooks:
	@scripts/demo-hooks.sh

# the fast tier for one's own loop (a few minutes, no runtime needed): fmt, the Markdown files' relative links
# (scripts/check-links.py), the one line width (scripts/line-width.py), no import cycle in either program
# (scripts/check-modules.py), clippy, rustdoc, unit tests, docs/flags.md against --help (tests/flags_doc.rs), and every
# fuzz target on 2000 inputs from a fixed seed; `make test` is the full run (every runtime, every phase)
check:
	cargo fmt --all -- --check
	python3 scripts/check-links.py
	python3 scripts/line-width.py
	python3 scripts/check-modules.py
	cargo clippy --locked --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps
	cargo test --locked --workspace --lib --bins
	cargo test --locked --workspace --test flags_doc --test git_revision
	FUZZ_RUNS=2000 FUZZ_SEED=1 scripts/fuzz.sh

test:
	@scripts/test.sh

# every cargo fuzz target for FUZZ_SECONDS (default 60) each
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

bench:
	@scripts/bench.sh

build:
	cargo build --locked --workspace --all-targets

# stripped, optimised binaries (cargo profile dist), packaged: target/dist/packages/*.deb and a tarball
release:
	@scripts/package.sh all

# only the two Debian packages (docs/operations.md)
deb:
	@scripts/package.sh deb

# stop and delete every containerd the scripts start (/tmp/rp-test-*-ctrd-1.6, -1.7, -2.1, -nri-1.7 and -nri-2.1,
# rp-demo-ctrd, rp-demo-hooks-ctrd, rp-bench-ctrd, rp-bench-ctrd-2.1, rp-bench-nri-ctrd-1.7 and -2.1)
clean-containerd:
	for root in /tmp/rp-*-ctrd*; do [ ! -d "$$root" ] || scripts/containerd.sh purge "$$root"; done
