"""A compromised SQL worker for the attack tests (runs inside the sandbox, beside the real ``skyrl_sql_worker``)."""
