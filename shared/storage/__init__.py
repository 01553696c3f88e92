"""Object storage: key layout and the local store (`store`), S3 (`s3`), atomic files (`files`)."""
