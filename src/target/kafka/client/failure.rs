//! A failure of the Kafka client, and its class (transient, a setting, fenced).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A failure of the Kafka client.
#[derive(Debug, Clone)]
pub struct KafkaFailure {
    pub message: String,
    /// The broker is unreachable or slow: retrying later may succeed.
    pub transient: bool,
    /// A setting librdkafka refuses (unknown property, invalid value).
    pub config: bool,
    /// A newer producer of the same `transactional.id` fenced this one: another writer of the
    /// pipeline runs.
    pub fenced: bool,
    /// What to do, when this failure has advice of its own (else its class's).
    pub hint: Option<&'static str>,
}

/// The hint of a position read that found a transaction neither committed nor aborted on the
/// position topic.
pub const UNDECIDED_HINT: &str = "The position topic holds a transaction the broker has not yet committed or aborted (seen after a broker restart); the worker reads the pipeline's position only once it is decided, and retries with back-off meanwhile: nothing is sent. If it stays, find it with kafka-transactions.sh --bootstrap-server <broker> find-hanging --broker-id <id> and abort it with kafka-transactions.sh abort.";

impl KafkaFailure {
    pub(super) fn transient(message: impl Into<String>) -> Self {
        KafkaFailure {
            message: message.into(),
            transient: true,
            config: false,
            fenced: false,
            hint: None,
        }
    }
    pub(super) fn from_kafka(context: &str, e: &KafkaError) -> Self {
        let config = matches!(
            e,
            KafkaError::ClientConfig(..) | KafkaError::ClientCreation(..)
        );
        let transient = !config
            && match e.rdkafka_error_code() {
                None => true,
                Some(code) => matches!(
                    code,
                    RDKafkaErrorCode::MessageTimedOut
                        | RDKafkaErrorCode::OperationTimedOut
                        | RDKafkaErrorCode::RequestTimedOut
                        | RDKafkaErrorCode::AllBrokersDown
                        | RDKafkaErrorCode::BrokerTransportFailure
                        | RDKafkaErrorCode::NetworkException
                        | RDKafkaErrorCode::LeaderNotAvailable
                        | RDKafkaErrorCode::NotLeaderForPartition
                        | RDKafkaErrorCode::BrokerNotAvailable
                        | RDKafkaErrorCode::NotEnoughReplicas
                        | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
                        | RDKafkaErrorCode::UnknownTopicOrPartition
                        | RDKafkaErrorCode::Resolve
                        | RDKafkaErrorCode::QueueFull
                        | RDKafkaErrorCode::PurgeQueue
                        | RDKafkaErrorCode::PurgeInflight
                        | RDKafkaErrorCode::CoordinatorNotAvailable
                        | RDKafkaErrorCode::Fatal
                        | RDKafkaErrorCode::OutOfOrderSequenceNumber
                        | RDKafkaErrorCode::UnknownProducerId
                        | RDKafkaErrorCode::InvalidProducerEpoch
                        | RDKafkaErrorCode::ProducerFenced
                        | RDKafkaErrorCode::Fenced
                        | RDKafkaErrorCode::ConcurrentTransactions
                        | RDKafkaErrorCode::CoordinatorLoadInProgress
                        | RDKafkaErrorCode::NotCoordinator
                        | RDKafkaErrorCode::TransactionCoordinatorFenced
                        | RDKafkaErrorCode::State
                        | RDKafkaErrorCode::Conflict
                ),
            };
        let config = config
            || matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::InvalidTransactionTimeout)
            );
        KafkaFailure {
            message: format!("{context}: {e}"),
            transient: transient && !config,
            config,
            fenced: false,
            hint: None,
        }
    }
}
