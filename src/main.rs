//! The `kiln` command line: demo, devices, run, bench, compile, inspect, ops, profile,
//! tune, train.
mod args;
mod commands;
mod data_set;
mod io;
mod progress;

use clap::{Parser, Subcommand};

/// Kiln: compile and run ONNX models on any GPU (WGSL through wgpu) or on the CPU.
#[derive(Parser)]
#[command(name = "kiln", version, about)]
struct Cli {
    /// More log output (-v: info, -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a sample network in code, run it on every available device, compare.
    Demo(commands::demo::Args),
    /// List the CPU and the GPU adapters with their limits and features.
    Devices(commands::devices::Args),
    /// Run a model once and print (or save) its outputs.
    Run(commands::run::Args),
    /// Compile a model to a .kiln artifact (optimised graph + weights) that loads fast.
    Compile(commands::compile::Args),
    /// Measure a model's latency.
    Bench(commands::bench::Args),
    /// Show what the compiler made of a model: nodes, fusion, passes, memory, DOT.
    Inspect(commands::inspect::Args),
    /// List the operators Kiln implements.
    Ops(commands::ops::Args),
    /// Trace loading and running a model into a Chrome trace (Perfetto, chrome://tracing):
    /// host phases and one slice per kernel, GPU-timed where the adapter allows.
    Profile(commands::profile::Args),
    /// Measure a model's kernel choices on a device and store the fastest in the tuning
    /// database (`run` and `bench` use it); --list and --clear manage the database.
    Tune(commands::tune::Args),
    /// Train a model on .npy data (forward, loss, backward and optimizer compiled as one
    /// graph), evaluate it, checkpoint, and export the trained model as ONNX.
    Train(commands::train::Args),
}

fn main() {
    // Output piped into `head` and closed early: end quietly like other Unix tools
    // instead of panicking on a write error.
    #[cfg(unix)]
    // SAFETY: restores the default SIGPIPE action before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // Mesa complains on stderr when XDG_RUNTIME_DIR is unset (containers, CI).
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("kiln-xdg-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).format_timestamp(None).init();
    let result = match cli.command {
        Command::Demo(a) => commands::demo::main(a),
        Command::Devices(a) => commands::devices::main(a),
        Command::Run(a) => commands::run::main(a),
        Command::Inspect(a) => commands::inspect::main(a),
        Command::Compile(a) => commands::compile::main(a),
        Command::Ops(a) => commands::ops::main(a),
        Command::Bench(a) => commands::bench::main(a),
        Command::Profile(a) => commands::profile::main(a),
        Command::Tune(a) => commands::tune::main(a),
        Command::Train(a) => commands::train::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", describe(&e));
        std::process::exit(1);
    }
}

/// An error and its causes joined by ": ", each cause said once: errors whose message
/// already includes their source's (as many library errors' do) are not repeated.
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn causes_are_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(io).context("cannot access 'x': No such file").context("cannot import x");
        assert_eq!(super::describe(&e), "cannot import x: cannot access 'x': No such file");
    }
}
