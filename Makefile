# The two quick-start commands, and the pieces they are made of.
# `make run` builds the example plugins and starts the host on runner.toml;
# `make test` builds the plugins and runs every test.
.PHONY: run test plugins polyglot check

run: plugins
	cargo run -p hourglass -- run

test: plugins
	cargo test --workspace

plugins:
	bash plugins/build.sh

# The Python and JavaScript example plugins (installs their pinned toolchains on first use).
polyglot:
	bash plugins/build-polyglot.sh

check:
	cargo clippy --workspace --all-targets -- -D warnings
