//! `cargo xtask`: the README's set-up commands. Each checks what the build needs beyond the
//! Rust toolchain, installs what is missing when it can (saying what and why) or stops with
//! the exact command to run, then builds and runs.
#![forbid(unsafe_code)]

mod prerequisites;

use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <command> [args…]

commands:
  demo [args…]   run the main example (the rebooking assistant) on the embedded store;
                 args go to the example (`--no-crash`, `--interactive`)
  test [args…]   run the workspace's tests: `cargo test --workspace [args…]`
  setup          install what the build needs, and nothing else
  check-setup    say what the build needs and whether this machine has it; install nothing

Each command but check-setup installs what is missing first, with the system's package
manager (as root, or through `sudo -n`), or stops with the command to run.";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match command.as_str() {
        "demo" => {
            let mut demo = cargo(&["run", "-p", "waymark-examples", "--bin", "rebook", "--"]);
            set_up_then(demo.args(&rest))
        }
        "test" => set_up_then(cargo(&["test", "--workspace"]).args(&rest)),
        "setup" => exit_code(prerequisites::install_missing()),
        "check-setup" => exit_code(prerequisites::check()),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        "" => usage_error("a command is needed"),
        other => usage_error(&format!("unknown command `{other}`")),
    }
}

fn usage_error(problem: &str) -> ExitCode {
    eprintln!("{problem}\n\n{USAGE}");
    ExitCode::from(2)
}

/// The cargo that runs this task (`CARGO`, which cargo sets), with `args`.
fn cargo(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(args);
    command
}

/// Installs what is missing, then runs `command`, exiting as it exits.
fn set_up_then(command: &mut Command) -> ExitCode {
    if let Err(problem) = prerequisites::install_missing() {
        eprintln!("{problem}");
        return ExitCode::FAILURE;
    }
    match command.status() {
        Ok(status) => status
            .code()
            .and_then(|code| u8::try_from(code).ok())
            .map_or(ExitCode::FAILURE, ExitCode::from),
        Err(error) => {
            eprintln!("cannot run {command:?}: {error}");
            ExitCode::FAILURE
        }
    }
}

fn exit_code(outcome: Result<(), String>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("{problem}");
            ExitCode::FAILURE
        }
    }
}
