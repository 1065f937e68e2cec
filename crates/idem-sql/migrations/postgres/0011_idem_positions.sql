-- A log consumer's position (Kafka): the offset of the last record a group
-- settled in a partition, written in the same transaction as its effects.
CREATE TABLE idem_positions (
    consumer_group TEXT   NOT NULL,
    topic          TEXT   NOT NULL,
    partition_id   BIGINT NOT NULL,
    last_offset    BIGINT NOT NULL,
    PRIMARY KEY (consumer_group, topic, partition_id)
);
