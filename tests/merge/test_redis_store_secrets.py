"""RedisStore never shows a password: not in errors, not in repr, whatever form carries it."""

from __future__ import annotations

import pytest

from trilink_spark.errors import InvalidArgumentError, StoreUnavailableError
from trilink_spark.merge import RedisStore


@pytest.mark.parametrize("url", [
    "http://:hunter2@h:1/0",
    "redis://user:hunter2@127.0.0.1:1/0",
    "redis://127.0.0.1:1/0?password=hunter2",
    "rediss://:hunter2@127.0.0.1:1/0?ssl_cert_reqs=none",
])
def test_no_password_in_errors_or_repr(url):
    try:
        store = RedisStore(url, socket_timeout=0.2)
    except InvalidArgumentError as err:
        assert "hunter2" not in str(err)
        return
    assert "hunter2" not in repr(store)
    with pytest.raises(StoreUnavailableError) as info:
        store.applied_flushes()
    assert "hunter2" not in str(info.value)
