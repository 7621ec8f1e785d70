//! `ferrum`: the command-line front end. Flags are parsed by clap into typed arguments, checked,
//! and handed to one function per subcommand. Errors reach the user as one clear message and a
//! non-zero exit status.

mod batch;
mod bench;
mod chat;
mod common;
mod inspect;
mod model_path;
mod parallel;
mod run;
mod serve;
mod structured;
mod tokenize;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Ferrum: an LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "ferrum", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a continuation of a prompt, streaming the text.
    Run(Box<run::RunArgs>),
    /// Chat with a model interactively, using its chat template.
    Chat(chat::ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Print the token ids of a text as {"ids": [...]}.
    Tokenize(tokenize::TokenizeArgs),
    /// Benchmarks: `latency` (prefill and decode speed of the model), `throughput`
    /// (offline requests through the batching engine), `serve` (online load on a server) and
    /// `soak` (fault-injecting load that checks a server's responses and recovery).
    Bench(bench::BenchArgs),
    /// Describe a model: architecture, sizes, tensor types, tokenizer and chat template.
    Inspect(inspect::InspectArgs),
}

fn main() -> ExitCode {
    // Chat templates run in a child process: this binary, with this arg.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == ferrum_tokenizer::sandbox::WORKER_ARG)
    {
        return ExitCode::from(ferrum_tokenizer::sandbox::worker_main() as u8);
    }
    let cli = Cli::parse();
    // MPI, when a parallel run starts it; finalised after the command ends.
    let launch = parallel::Launch::default();
    let result = match cli.command {
        Command::Run(args) => run::run(&args, &launch),
        Command::Chat(args) => chat::chat(&args, &launch),
        Command::Serve(args) => serve::serve(&args, &launch),
        Command::Tokenize(args) => tokenize::tokenize(&args),
        Command::Inspect(args) => inspect::inspect(&args),
        Command::Bench(args) => bench::bench(&args, &launch),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
