//! The `edge-llm` binary: parses the command line and reports errors; everything else lives in
//! the library (`edge_llm::cli`).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = edge_llm::cli::Cli::parse();
    match edge_llm::cli::run(cli) {
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
