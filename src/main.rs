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
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}
