//! The `edge-llm` binary: the subcommands, which face runs each (the terminal faces in
//! `edge_llm::cli`, the HTTP server in `edge_llm::server`), and errors reported on one line;
//! everything else lives in the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edge_llm::{cli, server};

fn main() -> ExitCode {
    let cli =
        Cli::parse_from(std::env::args_os().map(edge_llm::flags::kv_type::expand_llama_flags));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stdout pipe (`edge-llm run ... | head -c 10`) is not an error.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "edge-llm",
    version,
    about = "Run GGUF language models on edge machines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a GGUF file's metadata and tensor table.
    Info {
        #[command(flatten)]
        model: cli::ModelArgs,
    },
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        #[command(flatten)]
        model: cli::ModelArgs,
        /// Do not add the BOS token even if the model asks for one.
        #[arg(long)]
        no_bos: bool,
        /// Treat special tokens in TEXT (like <|im_start|>) as plain text.
        #[arg(long)]
        no_special: bool,
        /// The text to tokenize.
        text: String,
    },
    /// Complete a prompt (from -p, or from stdin) and print only the completion.
    Run(cli::RunArgs),
    /// Compute perplexity over a text file, like llama-perplexity.
    Perplexity(cli::PerplexityArgs),
    /// Measure prompt and generation speed, for one sequence or many sessions.
    Bench(cli::BenchArgs),
    /// Embed each input line (stdin or -f FILE): one JSON line per input line.
    Embed(cli::EmbedArgs),
    /// Chat in the terminal: several sessions at once, streaming replies (/help inside).
    Chat(cli::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).
    Serve(server::ServeArgs),
}

/// Runs the parsed command line.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info { model } => cli::info(&model),
        Command::Tokenize {
            model,
            no_bos,
            no_special,
            text,
        } => cli::tokenize(&model, no_bos, no_special, &text),
        Command::Run(args) => cli::run(&args),
        Command::Perplexity(args) => cli::perplexity(&args),
        Command::Bench(args) => cli::bench(&args),
        Command::Chat(args) => cli::chat(&args),
        Command::Embed(args) => cli::embed(&args),
        Command::Serve(args) => server::serve(&args),
    }
}

/// Longest cause printed in full; a longer one (a hostile file's string, say) is cut.
const MAX_CAUSE_CHARS: usize = 400;

/// The error's cause chain on one line: a cause that its parent's message already ends with
/// (an io error shown by its wrapper, then again as the source) is printed once, and each
/// cause is cut to `MAX_CAUSE_CHARS`.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if parts.last().is_some_and(|prev| prev.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts
        .iter()
        .map(|p| {
            let chars = p.chars().count();
            if chars <= MAX_CAUSE_CHARS {
                p.replace('\n', " ")
            } else {
                let head: String = p.chars().take(MAX_CAUSE_CHARS).collect();
                format!("{}... ({chars} characters in all)", head.replace('\n', " "))
            }
        })
        .collect::<Vec<_>>()
        .join(": ")
}
