#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Property test: every `AttributeValue` survives a JSON text round trip unchanged.

use agl_core::AttributeValue;
use proptest::prelude::*;

fn finite() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("JSON has no NaN/inf", |f| f.is_finite())
}

fn attribute_value() -> impl Strategy<Value = AttributeValue> {
    prop_oneof![
        any::<String>().prop_map(AttributeValue::Str),
        any::<bool>().prop_map(AttributeValue::Bool),
        any::<i64>().prop_map(AttributeValue::Int),
        finite().prop_map(AttributeValue::Float),
        // An empty array reads back as StrArray, so typed arrays are non-empty.
        prop::collection::vec(any::<String>(), 0..5).prop_map(AttributeValue::StrArray),
        prop::collection::vec(any::<bool>(), 1..5).prop_map(AttributeValue::BoolArray),
        prop::collection::vec(any::<i64>(), 1..5).prop_map(AttributeValue::IntArray),
        prop::collection::vec(finite(), 1..5).prop_map(AttributeValue::FloatArray),
    ]
}

proptest! {
    #[test]
    fn attribute_value_round_trips(v in attribute_value()) {
        let text = serde_json::to_string(&v).unwrap();
        let back: AttributeValue = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back, v);
    }
}
