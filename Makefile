# The two quick-start commands, and the pieces they are made of.
# `make run` checks for redis-server and the wasm32-wasip2 target (installing
#   them when run as root), builds the example plugins and starts the host on runner.toml;
# `make test` does the same set-up for every test's needs (see .ci/setup), builds
#   the plugins, runs every test on Redis and the Python and Node clients'
#   tests (clients/test.sh), then the Redis contract, model, workflows,
#   cluster and client tests again on Valkey (tests/valkey.sh).
.PHONY: run test plugins polyglot fmt check setup setup-run

run: setup-run plugins
	cargo run -p hourglass -- run

test: setup plugins
	cargo test --workspace
	cargo test -p hourglass-store --doc
	bash clients/test.sh
	bash tests/valkey.sh

setup:
	@bash .ci/setup

setup-run:
	@bash .ci/setup --run

plugins:
	bash plugins/build.sh

# The Python and JavaScript example plugins (installs their pinned toolchains on first use).
polyglot:
	bash plugins/build-polyglot.sh

fmt:
	cargo fmt --all
	cargo fmt --all --manifest-path plugins/Cargo.toml

check:
	cargo fmt --all --check
	cargo fmt --all --check --manifest-path plugins/Cargo.toml
	cargo clippy --workspace --all-targets -- -D warnings
