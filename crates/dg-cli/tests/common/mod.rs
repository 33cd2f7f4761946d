//! Helpers of the `dg` integration tests: run the built binary, parse its JSON, find the repo's
//! models and fixtures.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

pub fn bundled() -> PathBuf {
    repo().join("models/tiny-random")
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("fixtures").join(name)
}

/// What a run of `dg` gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts exit status 0 and returns self.
    #[track_caller]
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "dg failed:\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        self
    }

    /// Asserts exit status `code` and an error message on stderr containing every needle.
    #[track_caller]
    pub fn fails(self, code: i32, needles: &[&str]) -> Self {
        assert_eq!(self.code, code, "exit status\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        assert!(self.stderr.contains("error: "), "no error line: {}", self.stderr);
        for n in needles {
            assert!(self.stderr.contains(n), "stderr lacks {n:?}:\n{}", self.stderr);
        }
        self
    }

    /// Whether this GPU run found no adapter, which a GPU test may take as a visible SKIP only with
    /// `DG_ALLOW_NO_GPU=1`; otherwise it panics with how to install lavapipe.
    #[track_caller]
    pub fn found_no_gpu(&self, test: &str) -> bool {
        if !(self.code == 1 && self.stderr.contains("no GPU adapter found")) {
            return false;
        }
        if std::env::var("DG_ALLOW_NO_GPU").as_deref() == Ok("1") {
            eprintln!("SKIP {test}: no GPU adapter");
            return true;
        }
        panic!(
            "no GPU adapter (install lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1, or set DG_ALLOW_NO_GPU=1 to skip): {}",
            self.stderr
        );
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// The command with a private runtime directory (the Vulkan software driver wants one).
pub fn command(args: &[&str]) -> Command {
    let xdg = std::env::temp_dir().join("dg-cli-tests-xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dg"));
    cmd.args(args).env("XDG_RUNTIME_DIR", xdg).env_remove("DG_ADAPTER");
    cmd
}

/// Runs `cmd` with `stdin` as its standard input.
pub fn run_cmd(mut cmd: Command, stdin: &str) -> Run {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting dg");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out: Output = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `dg ARGS` with empty stdin.
pub fn dg(args: &[&str]) -> Run {
    run_cmd(command(args), "")
}

/// `dg ARGS` with `stdin`.
pub fn dg_stdin(args: &[&str], stdin: &str) -> Run {
    run_cmd(command(args), stdin)
}

/// `dg ARGS` where the Vulkan loader finds no driver, so wgpu sees no adapter.
pub fn dg_without_gpu(args: &[&str]) -> Run {
    let mut cmd = command(args);
    cmd.env("VK_DRIVER_FILES", "/nonexistent/dg-no-driver.json").env("VK_ICD_FILENAMES", "/nonexistent/dg-no-driver.json");
    run_cmd(cmd, "")
}

/// A JSON array of ids as `Vec<u32>`.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("an array of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// Copies the files of `from` into a new temporary directory, except those named in `skip`.
pub fn copy_model(from: &Path, skip: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if !skip.iter().any(|s| name == *s) {
            std::fs::copy(entry.path(), dir.path().join(&name)).unwrap();
        }
    }
    dir
}
