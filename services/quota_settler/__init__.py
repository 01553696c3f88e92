"""The quota settler: drives the GPU-quota saga from the job events (`splatq settler`)."""
