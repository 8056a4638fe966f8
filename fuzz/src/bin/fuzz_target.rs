//! One AFL++ target binary for every fuzz target: `fuzz-target NAME` runs
//! `edge_llm::fuzz::run_target(NAME, input)` in AFL++'s persistent mode. The models'
//! vocabularies are loaded before the fork server starts, so each input costs only the target.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    if !edge_llm::fuzz::TARGETS.contains(&name.as_str()) {
        eprintln!(
            "usage: fuzz-target TARGET (one of {})",
            edge_llm::fuzz::TARGETS.join(", ")
        );
        std::process::exit(2);
    }
    if name != "gguf" && name != "disk_block" {
        if let Err(e) = edge_llm::fuzz::vocabularies() {
            eprintln!("fuzz-target: {e:#}");
            std::process::exit(1);
        }
    }
    afl::fuzz!(|data: &[u8]| {
        edge_llm::fuzz::run_target(&name, data).expect("target set up");
    });
}
