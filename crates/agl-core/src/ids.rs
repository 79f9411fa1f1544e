//! Identifier and clock helpers.
//!
//! Responsible for generating the ids of the Agent Lightning v0.3 wire protocol (§2 of the
//! protocol reference) and for the server clock (`time.time()` equivalent, float seconds since
//! the Unix epoch). Not responsible for validating client-chosen ids (resources ids and worker
//! ids may be any string) nor for deciding *when* an id is issued (that is the store's job).

use std::time::{SystemTime, UNIX_EPOCH};

/// The reserved word that selects the latest attempt (`attempt_id = "latest"`) or the latest
/// resources (`GET /resources/latest`).
pub const LATEST: &str = "latest";

fn random_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A new rollout id: `"ro-"` followed by 12 lowercase hex characters, e.g. `"ro-c6e57c3ca2c7"`.
pub fn new_rollout_id() -> String {
    let hex = random_hex();
    format!("ro-{}", &hex[..12])
}

/// A new attempt id: `"at-"` followed by 8 lowercase hex characters, e.g. `"at-f041e3af"`.
pub fn new_attempt_id() -> String {
    let hex = random_hex();
    format!("at-{}", &hex[..8])
}

/// A new server-created resources id: `"rs-"` followed by 12 lowercase hex characters.
pub fn new_resources_id() -> String {
    let hex = random_hex();
    format!("rs-{}", &hex[..12])
}

/// A new OpenTelemetry trace id: 32 lowercase hex characters.
pub fn new_trace_id() -> String {
    random_hex()
}

/// A new OpenTelemetry span id: 16 lowercase hex characters.
pub fn new_span_id() -> String {
    // Skip the UUID version nibble (index 12) so all 16 characters are random.
    let hex = random_hex();
    format!("{}{}", &hex[..12], &hex[13..17])
}

/// The current time as float seconds since the Unix epoch (the server clock of the protocol).
///
/// Returns `0.0` if the system clock is set before 1970.
pub fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_lower_hex(s: &str) -> bool {
        s.chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    }

    #[test]
    fn ids_have_the_wire_formats() {
        let ro = new_rollout_id();
        assert!(
            ro.starts_with("ro-") && ro.len() == 15 && is_lower_hex(&ro[3..]),
            "{ro}"
        );
        let at = new_attempt_id();
        assert!(
            at.starts_with("at-") && at.len() == 11 && is_lower_hex(&at[3..]),
            "{at}"
        );
        let rs = new_resources_id();
        assert!(
            rs.starts_with("rs-") && rs.len() == 15 && is_lower_hex(&rs[3..]),
            "{rs}"
        );
        let tr = new_trace_id();
        assert!(tr.len() == 32 && is_lower_hex(&tr), "{tr}");
        let sp = new_span_id();
        assert!(sp.len() == 16 && is_lower_hex(&sp), "{sp}");
    }

    #[test]
    fn ids_are_unique() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_rollout_id()).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn clock_is_unix_seconds() {
        let now = now_seconds();
        // 2020-01-01 .. 2200-01-01: seconds, not milliseconds or nanoseconds.
        assert!(now > 1.577e9 && now < 7.258e9, "{now}");
    }
}
