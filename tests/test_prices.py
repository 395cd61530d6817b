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


def price_item(sku: str, usd: str, unit: str = "Hrs", begin: str = "0") -> str:
    """One PriceList entry as the API sends it: a JSON string."""
    return json.dumps(
        {
            "product": {"sku": sku, "attributes": {"regionCode": "us-east-1"}},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": unit,
                                "pricePerUnit": {"USD": usd},
                                "beginRange": begin,
                            },
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
    aws = [
        o
        for o in before
        if o["target"] in ("sagemaker", "kubernetes") and o.get("billing", "hourly") == "hourly"
    ]
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
        for group, answer in (
            # tiered: the first tier's price is the one taken
            (
                "AWS-Lambda-Duration",
                [
                    price_item("L1", "0.0000150000", "Lambda-GB-Second", "6000000000"),
                    price_item("L1", "0.0000170000", "Lambda-GB-Second"),
                ],
            ),
            ("AWS-Lambda-Requests", [price_item("L2", "0.0000002100", "Requests")]),
        ):
            filters = [
                {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"},
                {"Type": "TERM_MATCH", "Field": "group", "Value": group},
            ]
            stub.add_response(
                "get_products",
                {"PriceList": answer, "FormatVersion": "aws_v1"},
                {
                    "ServiceCode": "AWSLambda",
                    "Filters": filters,
                    "FormatVersion": "aws_v1",
                    "MaxResults": ANY,
                },
            )
        changed = prices.refresh(client, table, today=datetime.date(2027, 1, 2))
        stub.assert_no_pending_responses()
    after = {(o["target"], o["name"]): o for o in json.loads(table.read_text())["offers"]}
    for number, offer in enumerate(aws):
        now = after[(offer["target"], offer["name"])]
        assert now["usd_per_hour"] == pytest.approx(number + 1.5)
        assert now["as_of"] == "2027-01-02" and "Price List API" in now["source"]
    lambdas = [o for o in before if o["target"] == "aws_lambda"]
    for offer in lambdas:  # per use: its price per GB-second and per request
        now = after[("aws_lambda", offer["name"])]
        assert now["usd_per_gb_s"] == pytest.approx(0.000017)
        assert now["usd_per_million_requests"] == pytest.approx(0.21)
        assert now["as_of"] == "2027-01-02" and "AWSLambda" in now["source"]
    assert len(changed) == len(aws) + 2 * len(lambdas)
    for offer in before:  # Modal and SageMaker serverless: by hand, untouched
        if offer["target"] == "modal" or offer["name"].startswith("ml.serverless"):
            assert after[(offer["target"], offer["name"])] == offer
    assert table.read_text().count("\n") == len(before) + 5  # one offer a line


def test_an_offer_the_api_prices_not_is_left_as_it_was(tmp_path: Path) -> None:
    assert prices.on_demand_usd([]) is None
    assert prices.on_demand_usd([price_item("A", "0.0000000000")]) is None
    assert prices.on_demand_usd([price_item("A", "1.2340000000")]) == pytest.approx(1.234)
