"""Scheduled maintenance and dead-letter policies: the redriver's library (services/dlq_redriver/
runs it). Cron schedules in UTC, fenced lease locks per task run, checkpointed batches."""
