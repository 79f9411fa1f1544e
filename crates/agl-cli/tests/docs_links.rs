//! Every relative link and `#anchor` in the README and in `docs/**/*.md` resolves, checked
//! offline: a link's target file or folder exists, and an anchor (`#heading` in the same file or
//! `page.md#heading`) is the GitHub slug of a heading of the target page. Links with a scheme
//! (`http:`, `https:`, `mailto:`) are not followed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The repository root: README.md and docs/ live there.
fn repo_root() -> PathBuf {
    normalize(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// GitHub's heading slug (github-slugger): lowercase, drop every character that is not a letter,
/// a digit, `_`, `-` or a space, then turn each space into `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings in order; a repeated slug gets `-1`, `-2`, … as on GitHub.
fn anchors(headings: &[String]) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for heading in headings {
        let base = slug(heading);
        let mut anchor = base.clone();
        while seen.contains_key(&anchor) {
            let n = seen.entry(base.clone()).or_insert(0);
            *n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor.clone(), 0);
        out.insert(anchor);
    }
    out
}

/// A link or image target of a page, with the line it is on.
struct Link {
    line: usize,
    dest: String,
}

/// A page's headings (their text as rendered) and its links.
struct Page {
    headings: Vec<String>,
    links: Vec<Link>,
}

fn parse(markdown: &str) -> Page {
    let mut headings = Vec::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    let line_of = |offset: usize| markdown[..offset].matches('\n').count() + 1;
    for (event, range) in Parser::new_ext(markdown, Options::ENABLE_TABLES).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => headings.extend(heading.take()),
            Event::Text(text) | Event::Code(text) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&text);
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => links.push(Link {
                line: line_of(range.start),
                dest: dest_url.to_string(),
            }),
            _ => {}
        }
    }
    Page { headings, links }
}

/// Whether a link leaves the repository (`https://…`, `mailto:…`): those are not checked.
fn is_external(dest: &str) -> bool {
    let lower = dest.to_ascii_lowercase();
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// `a/./b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// `%20` and the like decoded; anything malformed is left as written.
fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// Every broken link of `pages` (path → Markdown), one line each: the page and line, the link,
/// and what is missing. `exists` says whether a target path exists; `read` gives the Markdown of
/// a target page that is not among `pages` (None: unreadable).
fn broken_links(
    root: &Path,
    pages: &BTreeMap<PathBuf, String>,
    exists: &dyn Fn(&Path) -> bool,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Vec<String> {
    let mut parsed: HashMap<PathBuf, Page> = pages
        .iter()
        .map(|(path, text)| (path.clone(), parse(text)))
        .collect();
    let mut problems = Vec::new();
    for path in pages.keys() {
        let shown = path
            .strip_prefix(root)
            .unwrap_or(path)
            .display()
            .to_string();
        let links: Vec<(usize, String)> = parsed[path]
            .links
            .iter()
            .map(|l| (l.line, l.dest.clone()))
            .collect();
        for (line, dest) in links {
            if dest.is_empty() || is_external(&dest) {
                continue;
            }
            let (file, anchor) = match dest.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (dest.as_str(), None),
            };
            let file = percent_decode(file.split('?').next().unwrap_or(""));
            let target = if file.is_empty() {
                path.clone()
            } else if let Some(from_root) = file.strip_prefix('/') {
                normalize(&root.join(from_root))
            } else {
                normalize(&path.parent().unwrap_or(root).join(&file))
            };
            let target_shown = target
                .strip_prefix(root)
                .unwrap_or(&target)
                .display()
                .to_string();
            if !pages.contains_key(&target) && !exists(&target) {
                problems.push(format!(
                    "{shown}:{line}: link `{dest}`: {target_shown} does not exist"
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().and_then(|e| e.to_str()) != Some("md") {
                continue;
            }
            if !parsed.contains_key(&target) {
                match read(&target) {
                    Some(text) => {
                        parsed.insert(target.clone(), parse(&text));
                    }
                    None => {
                        problems.push(format!(
                            "{shown}:{line}: link `{dest}`: {target_shown} cannot be read"
                        ));
                        continue;
                    }
                }
            }
            let anchor = percent_decode(anchor);
            if !anchors(&parsed[&target].headings).contains(&anchor) {
                problems.push(format!(
                    "{shown}:{line}: link `{dest}`: no heading in {target_shown} has the anchor `#{anchor}`"
                ));
            }
        }
    }
    problems
}

/// README.md and every `*.md` under docs/, recursively.
fn doc_pages(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some("md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut files);
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (normalize(&path), text)
        })
        .collect()
}

#[test]
fn every_relative_link_and_anchor_in_readme_and_docs_resolves() {
    let root = repo_root();
    let pages = doc_pages(&root);
    assert!(
        pages.len() >= 2,
        "expected README.md and pages under docs/ in {}",
        root.display()
    );
    let problems = broken_links(&root, &pages, &|p| p.exists(), &|p| {
        std::fs::read_to_string(p).ok()
    });
    assert!(
        problems.is_empty(),
        "{} broken link(s) in README.md and docs/:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Where agl differs from the Python originals"),
        "where-agl-differs-from-the-python-originals"
    );
    assert_eq!(slug("The LLM engine (`agl-llm`)"), "the-llm-engine-agl-llm");
    assert_eq!(
        slug("Built-in policies (one file each in crates/agl-gov/src/policies/)"),
        "built-in-policies-one-file-each-in-cratesagl-govsrcpolicies"
    );
    assert_eq!(slug("The seed API's hot paths"), "the-seed-apis-hot-paths");
    assert_eq!(slug("snake_case & Ünïcode"), "snake_case--ünïcode");
    // The rendered text counts: inline code keeps its content, emphasis loses its markers.
    let page = parse("# The LLM engine (`agl-llm`)\n\n## **Bold** and [a link](x.md)\n");
    assert_eq!(
        page.headings,
        ["The LLM engine (agl-llm)", "Bold and a link"]
    );
    // Repeated headings get -1, -2 in order of appearance.
    let headings: Vec<String> = ["Speed", "Speed", "Speed", "Speed-1 x"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let got = anchors(&headings);
    for want in ["speed", "speed-1", "speed-2", "speed-1-x"] {
        assert!(got.contains(want), "missing {want} in {got:?}");
    }
    assert_eq!(got.len(), 4);
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let root = PathBuf::from("/repo");
    let pages: BTreeMap<PathBuf, String> = [
        (
            root.join("README.md"),
            "# Top\n\n## Set up\n\n[ok](docs/a.md#speed) [ok](#set-up) [ok](docs/img/x.png)\n\
             [gone](docs/missing.md)\n[bad anchor](docs/a.md#nope)\n[bad here](#set-upp)\n\
             [web](https://example.com/#whatever) [mail](mailto:a@b.c)\n"
                .to_string(),
        ),
        (
            root.join("docs/a.md"),
            "# A\n\n## Speed\n\n[back](../README.md#top) [up](../README.md#nowhere)\n".to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let exists = |p: &Path| p == Path::new("/repo/docs/img/x.png");
    let problems = broken_links(&root, &pages, &exists, &|_| None);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems[0]
            .starts_with("README.md:6: link `docs/missing.md`: docs/missing.md does not exist"),
        "{problems:#?}"
    );
    assert!(
        problems[1].contains(
            "README.md:7: link `docs/a.md#nope`: no heading in docs/a.md has the anchor `#nope`"
        ),
        "{problems:#?}"
    );
    assert!(
        problems[2].contains("README.md:8: link `#set-upp`: no heading in README.md"),
        "{problems:#?}"
    );
    assert!(
        problems[3].contains("docs/a.md:5: link `../README.md#nowhere`"),
        "{problems:#?}"
    );
}
