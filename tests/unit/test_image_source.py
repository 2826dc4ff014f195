"""What the service does with an image_url that is not a URL at all: the client's 400, never a 500 (found by the API
fuzz test: urllib raises ValueError for "http://[")."""

from __future__ import annotations

import pytest

from service.engine.errors import APIError
from service.engine.images import ImageLimits
from service.http.image_source import fetch, load


@pytest.mark.parametrize("url", ["http://[", "https://[::1", "http://]x["])
def test_a_url_urllib_cannot_split_is_a_400_naming_the_field(url):
    with pytest.raises(APIError) as refused:
        load(url, "messages[0].content[0].image_url", ImageLimits(max_bytes=1024, max_pixels=4096, max_side=0),
             ("example.com",))
    assert refused.value.status == 400 and refused.value.param == "messages[0].content[0].image_url"


def test_a_port_out_of_range_is_a_400():
    with pytest.raises(APIError) as refused:
        fetch("http://example.com:99999/x.png", "p", 1024, ("example.com",))
    assert refused.value.status == 400 and "port" in str(refused.value)
