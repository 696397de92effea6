"""On-policy distillation: a teacher behind an OpenAI-compatible server scores the student's tokens."""
