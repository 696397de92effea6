"""The InferenceGroup: old-policy and reference log-probs on devices of their own."""
