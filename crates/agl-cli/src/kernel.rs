//! Building governance kernels from policy files the way every command does: the kernel a
//! policy file declares, with a flight recorder attached when asked, and the table row counts
//! its cost policy prices.
//!
//! Not for what a kernel checks (`agl_gov`) or for the kernel of a prepared Spider task (its
//! table statistics and check cache), which `agl_spider::build_kernel` builds.

use std::path::Path;
use std::sync::Arc;

use agl_gov::{BuildEnv, FlightRecorder, GovError, Kernel, PolicyFile, TableStats};
use agl_spider::{Question, SpiderDataset, db_info};

/// The kernel `policy` declares for `env`, sharing `recorder` when one is given.
pub fn build_kernel(
    policy: &PolicyFile,
    env: &BuildEnv,
    recorder: Option<Arc<FlightRecorder>>,
) -> Result<Kernel, GovError> {
    let kernel = policy.build(env)?;
    Ok(match recorder {
        Some(r) => kernel.with_shared_recorder(r),
        None => kernel,
    })
}

/// Opens (or continues) the flight-recorder database at `path`, keyed when
/// `$AGL_AUDIT_KEY_FILE` names a key file.
pub fn open_recorder(path: &Path) -> anyhow::Result<Arc<FlightRecorder>> {
    let hmac_key = match std::env::var_os(agl_gov::AUDIT_KEY_FILE_ENV).filter(|v| !v.is_empty()) {
        Some(k) => Some(agl_gov::hmac_key_from_file(Path::new(&k))?),
        None => None,
    };
    let config = agl_gov::RecorderConfig {
        hmac_key,
        ..agl_gov::RecorderConfig::default()
    };
    Ok(Arc::new(FlightRecorder::open(path, config)?))
}

/// Row counts of every table of the questions' databases (what `cost_control` prices).
pub fn table_stats<'a>(
    dataset: &SpiderDataset,
    questions: impl IntoIterator<Item = &'a Question>,
) -> anyhow::Result<TableStats> {
    let mut stats = TableStats::new();
    for q in questions {
        if !stats.contains_key(&q.db_id) {
            let info = db_info(&q.db_id, &dataset.db_path(&q.db_id))?;
            stats.insert(q.db_id.clone(), info.row_counts());
        }
    }
    Ok(stats)
}
