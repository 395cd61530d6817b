"""The price table's refresh against the Price List API's own answers (botocore's Stubber checks
every call against the service's model: its parameters, filters and shape), on a copy."""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from infinity_cloud.sizing import prices


def price_item(sku: str, usd: str, unit: str = "Hrs") -> str:
    """One PriceList entry as the API sends it: a JSON string."""
    return json.dumps(
        {
            "product": {"sku": sku, "attributes": {"regionCode": "us-east-1"}},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": unit, "pricePerUnit": {"USD": usd}},
                        }
                    }
                }
            },
        }
    )


def test_refresh_rewrites_the_aws_prices_with_their_source_and_date(tmp_path: Path) -> None:
    table = tmp_path / "offers.json"
    shutil.copy(prices.table_path(), table)
    before = json.loads(table.read_text())["offers"]
    aws = [o for o in before if o["target"] in ("sagemaker", "kubernetes")]
    client = boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stub:
        for number, offer in enumerate(aws):
            service, field, fixed = prices._SERVICES[offer["target"]]
            filters = prices._filters(field, offer["name"], "us-east-1", fixed)
            answer = [
                price_item(f"SKU{number}", "0.0000000000", "Quantity"),
                price_item(f"SKU{number}", f"{number + 1}.5"),
            ]
            stub.add_response(
                "get_products",
                {"PriceList": answer, "FormatVersion": "aws_v1"},
                {"ServiceCode": service, "Filters": filters, "FormatVersion": "aws_v1", "MaxResults": ANY},
            )
        changed = prices.refresh(client, table, today=datetime.date(2027, 1, 2))
        stub.assert_no_pending_responses()
    after = {(o["target"], o["name"]): o for o in json.loads(table.read_text())["offers"]}
    for number, offer in enumerate(aws):
        now = after[(offer["target"], offer["name"])]
        assert now["usd_per_hour"] == pytest.approx(number + 1.5)
        assert now["as_of"] == "2027-01-02" and "Price List API" in now["source"]
    assert len(changed) == len(aws)
    for offer in before:  # Modal and Lambda: by hand, untouched
        if offer["target"] not in ("sagemaker", "kubernetes"):
            assert after[(offer["target"], offer["name"])] == offer


def test_an_offer_the_api_prices_not_is_left_as_it_was(tmp_path: Path) -> None:
    assert prices.on_demand_usd([]) is None
    assert prices.on_demand_usd([price_item("A", "0.0000000000")]) is None
    assert prices.on_demand_usd([price_item("A", "1.2340000000")]) == pytest.approx(1.234)
