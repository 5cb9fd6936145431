//! Test-only: a plain WASI command, which the host must reject as a task handler.

fn main() {
    println!("I am a command, not a task handler");
}
