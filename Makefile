# The two quick-start commands, and the pieces they are made of.
# `make run` builds the example plugins and starts the host on runner.toml;
# `make test` builds the plugins and runs every test.
.PHONY: run test plugins check

run: plugins
	cargo run -p hourglass -- run

test: plugins
	cargo test --workspace

plugins:
	bash plugins/build.sh

check:
	cargo clippy --workspace --all-targets -- -D warnings
