//! Kafka targets: librdkafka properties are taken by allow-list from non-superusers.

#[allow(unused_imports)]
use super::*;
