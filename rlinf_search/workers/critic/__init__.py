"""The critic (PPO's value model): a causal-LM backbone with a scalar value head, its trainer and worker."""
