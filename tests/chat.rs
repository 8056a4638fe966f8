//! `edge-llm chat` on the real default model, driven the two ways people drive it: through a
//! pipe (one reply line per message, slash commands, `/save` then `/load` in a later run) and
//! through a real terminal in tmux (two sessions generating at once, `/fork`, `/save` and
//! `/load`, Ctrl+C stopping a reply without ending the program, Ctrl+D quitting).
//!
//! The tests share the machine's few cores, so they run one at a time.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh directory for one test's files (history, saved conversations).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edge-llm-chat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn chat_pipe(dir: &Path, extra: &[&str], stdin: &str) -> Output {
    let model = support::model_path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .arg("chat")
        .arg("-m")
        .arg(&model)
        .args(extra)
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CACHE_HOME", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn pipe_prints_one_reply_line_per_message_and_nothing_else() {
    let _serial = serial();
    let dir = scratch("pipe");
    let script = "/set temp 0\n/set max_tokens 12\nWhat is the capital of France?\n/list\n/nonsense\nAnd of Germany?\n";
    let first = chat_pipe(&dir, &[], script);
    let replies = stdout_lines(&first);
    assert_eq!(replies.len(), 2, "two messages, two lines: {replies:?}");
    assert!(replies.iter().all(|r| !r.trim().is_empty()), "{replies:?}");
    // Command output and errors went to stderr.
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        stderr.contains("temp 0 ") && stderr.contains("max_tokens 12"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown command /nonsense"), "{stderr}");
    assert!(stderr.contains("* 1: 2 messages"), "{stderr}");
    // Greedy replies are the same every time.
    let again = chat_pipe(&dir, &[], script);
    assert_eq!(stdout_lines(&again), replies);
    // No prompts or banners: a pipe never writes the history file either.
    assert!(!dir.join("edge-llm/history").exists());
}

#[test]
fn pipe_multi_line_messages_are_one_message() {
    let _serial = serial();
    let dir = scratch("multiline");
    let out = chat_pipe(
        &dir,
        &["--temp", "0", "-n", "4"],
        "Say \\\nhello.\n\"\"\"\nSay\n\ngoodbye.\n\"\"\"\n/list\n",
    );
    assert_eq!(stdout_lines(&out).len(), 2, "{:?}", stdout_lines(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("* 1: 4 messages, idle, \"Say hello.\""),
        "{stderr}"
    );
}

#[test]
fn pipe_save_then_load_in_a_second_run_continues_the_conversation() {
    let _serial = serial();
    let dir = scratch("save-load");
    let file = dir.join("conversation.json");
    let f = file.to_str().unwrap();
    let first_turn = "/set temp 0\n/set max_tokens 12\n/system You are a terse assistant.\nMy name is Ann. Please remember it.\n";
    let saved = chat_pipe(&dir, &[], &format!("{first_turn}/save {f}\n"));
    assert_eq!(stdout_lines(&saved).len(), 1);

    let conv: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(conv["system"], "You are a terse assistant.");
    let messages = conv["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{conv}");
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(
        messages[0]["content"],
        "My name is Ann. Please remember it."
    );
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(
        messages[1]["content"].as_str().unwrap(),
        stdout_lines(&saved)[0]
    );
    assert_eq!(conv["sampling"]["temperature"], 0.0);
    assert_eq!(conv["sampling"]["max_tokens"], 12);

    // A new run loads it (settings included: no /set here) and goes on...
    let loaded = chat_pipe(&dir, &[], &format!("/load {f}\nWhat is my name?\n"));
    let continued = stdout_lines(&loaded);
    assert_eq!(continued.len(), 1, "{continued:?}");
    // ...exactly as one run holding the whole conversation does.
    let whole = chat_pipe(&dir, &[], &format!("{first_turn}What is my name?\n"));
    assert_eq!(stdout_lines(&whole)[1], continued[0]);
}

/// A chat program running in a private tmux server, read through `capture-pane`.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `edge-llm chat ARGS` in a 160x50 terminal; None (the test is skipped, with the
    /// reason printed) when tmux is missing and cannot be installed.
    fn start(name: &str, dir: &Path, args: &[&str]) -> Option<Tmux> {
        if !ensure_tmux() {
            return None;
        }
        let socket = format!("edge-llm-{}-{name}", std::process::id());
        let model = support::model_path();
        let mut command = vec![
            "env".to_string(),
            format!("XDG_DATA_HOME={}", dir.display()),
            format!("XDG_CACHE_HOME={}", dir.display()),
            env!("CARGO_BIN_EXE_edge-llm").to_string(),
            "chat".into(),
            "-m".into(),
            model.to_str().unwrap().into(),
        ];
        command.extend(args.iter().map(|a| a.to_string()));
        let status = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "50",
            ])
            .args(command)
            .status()
            .expect("tmux runs");
        assert!(status.success(), "tmux new-session failed");
        let t = Tmux { socket };
        t.wait_for("the first prompt", |p| last_line(p) == "[1]>");
        Some(t)
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux runs")
    }

    /// Types `text` literally, then Enter.
    fn line(&self, text: &str) {
        self.tmux(&["send-keys", "-l", text]);
        self.keys(&["Enter"]);
    }

    /// Sends named keys (`Enter`, `C-c`, `C-d`).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// The whole pane, wrapped lines joined, trailing blank lines dropped.
    fn screen(&self) -> String {
        let out = self.tmux(&["capture-pane", "-p", "-J", "-S", "-"]);
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    fn alive(&self) -> bool {
        self.tmux(&["has-session"]).status.success()
    }

    /// Waits up to three minutes (a loaded 2-core machine is slow) for the screen to satisfy `done`.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            if start.elapsed() > Duration::from_secs(180) || !self.alive() {
                panic!("waited for {what}; the screen:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types a line and waits for the prompt of session `n` to come back after it.
    fn command(&self, text: &str, n: usize) -> String {
        let before = self.screen().len();
        self.line(text);
        let prompt = format!("[{n}]>");
        self.wait_for(&format!("{text:?} to finish"), |s| {
            s.len() > before && last_line(s) == prompt
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

fn last_line(screen: &str) -> &str {
    screen.lines().last().unwrap_or("").trim()
}

/// The output printed after the last line that starts with `prefix`, up to the next prompt
/// (empty while there is no such line).
fn output_after<'a>(screen: &'a str, prefix: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = screen.lines().collect();
    let Some(start) = lines.iter().rposition(|l| l.starts_with(prefix)) else {
        return Vec::new();
    };
    lines[start + 1..]
        .iter()
        .take_while(|l| !is_prompt(l))
        .copied()
        .collect()
}

/// Like `output_after`, for a command known to have run: its output must be there.
fn output_of<'a>(screen: &'a str, prefix: &str) -> Vec<&'a str> {
    let out = output_after(screen, prefix);
    assert!(!out.is_empty(), "no output after {prefix:?} in\n{screen}");
    out
}

/// Whether a screen line is a prompt (`[3]>` and what was typed after it).
fn is_prompt(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once("]>"))
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// Whether tmux is here (scripts/test.sh installs it); under `CI=true` its absence fails the
/// test with the reason, elsewhere the test is skipped, saying why.
fn ensure_tmux() -> bool {
    let have = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        support::skip_or_fail(
            "tmux is not installed (scripts/test.sh installs it: apt-get install -y tmux)",
        );
    }
    have
}

#[test]
fn terminal_two_sessions_generate_at_once_and_ctrl_c_stops_a_reply() {
    let _serial = serial();
    let dir = scratch("tty-sessions");
    let Some(t) = Tmux::start("sessions", &dir, &["--temp", "0", "-n", "16"]) else {
        return;
    };

    // Session 1 starts a reply; as soon as it streams, typing sends it to the background. The
    // replies are long (and /new keeps the setting), so session 1 is still generating when the
    // typed-ahead lines are read, however loaded the machine: 16 tokens once finished first.
    t.command("/set max_tokens 160", 1);
    t.line("Write a poem about the sea.");
    t.wait_for("session 1's reply to stream", |s| {
        output_after(s, "[1]> Write a poem about the sea.")
            .iter()
            .any(|l| !l.trim().is_empty())
    });
    // Typed while session 1 streams: both lines are read ahead and run at once.
    t.line("/new");
    t.line("Write a poem about the moon.");
    t.wait_for("session 2", |s| {
        s.contains("[session 1 keeps replying in the background")
            && s.contains("[2]> Write a poem about the moon.")
    });
    // Both finish; session 1 finished after session 2's message went in, so both generated
    // at once.
    let screen = t.wait_for("both replies", |s| {
        s.lines().any(|l| {
            l.starts_with("[session 1: reply finished, ") && l.ends_with("; /switch 1 shows it]")
        }) && (s.contains("[session 2: reply finished")
            || output_after(s, "[2]> Write a poem").len() >= 2)
            && last_line(s) == "[2]>"
    });
    let asked = screen.find("[2]> Write a poem about the moon.").unwrap();
    let finished = screen.find("[session 1: reply finished").unwrap();
    assert!(
        asked < finished,
        "session 1 had finished before session 2 started:\n{screen}"
    );

    let screen = t.command("/list", 2);
    let list = output_of(&screen, "[2]> /list");
    assert!(list[0].starts_with("  1: 2 messages"), "{list:?}");
    assert!(list[1].starts_with("* 2: 2 messages"), "{list:?}");
    // Switching back shows what session 1 produced meanwhile.
    let screen = t.command("/switch 1", 1);
    let shown = output_of(&screen, "[2]> /switch 1");
    assert!(
        shown[0].starts_with("session 1: 2 messages, reply ready"),
        "{shown:?}"
    );
    assert!(
        shown.len() >= 2 && shown[1..].iter().any(|l| !l.trim().is_empty()),
        "{shown:?}"
    );

    // Ctrl+C stops a streaming reply and the program goes on (a long one, so that it is
    // still streaming when the key comes).
    t.command("/set max_tokens 256", 1);
    t.line("Tell me a long story about a dragon.");
    t.wait_for("the story to stream", |s| {
        output_after(s, "[1]> Tell me a long story")
            .iter()
            .any(|l| !l.trim().is_empty())
    });
    t.keys(&["C-c"]);
    t.wait_for("the reply to stop", |s| {
        s.contains("[stopped]") && last_line(s) == "[1]>"
    });
    // At an idle prompt Ctrl+C only says how to quit.
    t.keys(&["C-c"]);
    t.wait_for("the hint", |s| s.contains("(Ctrl+D or /exit quits)"));
    let screen = t.command("/list", 1);
    assert!(
        output_of(&screen, "[1]> /list")[0].starts_with("* 1: 4 messages"),
        "{screen}"
    );
    // Ctrl+D quits; the history file has what was typed.
    t.keys(&["C-d"]);
    let start = Instant::now();
    while t.alive() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!t.alive(), "Ctrl+D did not quit");
    let history = std::fs::read_to_string(dir.join("edge-llm/history")).expect("a history file");
    assert!(
        history.contains("Write a poem about the moon.") && history.contains("/switch 1"),
        "{history}"
    );
}

#[test]
fn terminal_fork_save_and_load() {
    let _serial = serial();
    let dir = scratch("tty-fork");
    let file = dir.join("forked.json");
    let Some(t) = Tmux::start("fork", &dir, &["-n", "16"]) else {
        return;
    };
    t.command("/set temp 0", 1);
    t.command("Hi! My name is Ann.", 1);

    let screen = t.command("/fork", 2);
    assert!(
        screen.contains("session 2: a fork of session 1 (2 messages)"),
        "{screen}"
    );
    t.command("What is my name?", 2);
    // The fork's prompt starts with session 1's conversation: served from the prefix cache.
    let screen = t.command("/stats", 2);
    let stats = output_of(&screen, "[2]> /stats").join(" ");
    let cached: usize = stats
        .split("tokens, ")
        .nth(1)
        .and_then(|s| s.split(" cached").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cached count in {stats:?}"));
    assert!(cached >= 16, "{stats}");
    assert!(stats.contains("engine: blocks"), "{stats}");

    let screen = t.command(&format!("/save {}", file.display()), 2);
    assert!(screen.contains("saved 4 messages"), "{screen}");
    let conv: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let roles: Vec<&str> = conv["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(conv["messages"][2]["content"], "What is my name?");
    assert_eq!(conv["sampling"]["temperature"], 0.0);

    t.command("/new", 3);
    let screen = t.command(&format!("/load {}", file.display()), 3);
    assert!(screen.contains("loaded 4 messages"), "{screen}");
    t.command("Thanks!", 3);
    let screen = t.command("/list", 3);
    let list = output_of(&screen, "[3]> /list");
    assert!(list[0].starts_with("  1: 2 messages"), "{list:?}");
    assert!(list[1].starts_with("  2: 4 messages"), "{list:?}");
    assert!(list[2].starts_with("* 3: 6 messages"), "{list:?}");
    t.line("/exit");
}
