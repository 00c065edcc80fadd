"""S3 prefix isolation with the IAM policy of docs/tenants.md, on moto's server with IAM
enforcement on (/moto-api/reset-auth 0, as INITIAL_NO_AUTH_ACTION_COUNT=0 would).

What moto enforces (moto/core/authorization.py, moto/iam/access_control.py): the SigV4 signature
of an IAM access key, and the policies attached to its user, by action and resource ARN
(`arn:aws:s3:::bucket/key` for objects, `arn:aws:s3:::bucket` for ListBucket). What it does not:
policy conditions other than StringEquals are ignored, and no `s3:prefix` value is ever supplied,
so the ListBucket condition cannot be checked here (docs/tenants.md says so), and bucket
policies are not evaluated. The object reads and writes below are real denials.
"""

from __future__ import annotations

import json

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

from tests.support.repo import REPO
from tests.support.services import s3_server
from worker.store.s3 import S3Store

BUCKET, PREFIX = "shared", "runs"


def tenant_policy(tenant: str) -> dict:
    """docs/tenants.md's policy for one tenant, with BUCKET and PREFIX filled in."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": f"arn:aws:s3:::{BUCKET}",
                "Condition": {"StringLike": {"s3:prefix": [f"{PREFIX}/{tenant}/*", f"{PREFIX}/{tenant}"]}},
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": f"arn:aws:s3:::{BUCKET}/{PREFIX}/{tenant}/*",
            },
        ],
    }


def test_docs_policy_matches_this_one():
    text = (REPO / "docs" / "tenants.md").read_text()
    block = text.split("```json", 1)[1].split("```", 1)[0]
    documented = json.loads(block.replace("BUCKET", BUCKET).replace("PREFIX", PREFIX))
    assert documented == tenant_policy("team-a")


@pytest.fixture(scope="module")
def enforcing():
    """(endpoint, clients by tenant) of a moto server enforcing IAM, team-a and team-b users with the policy."""
    with s3_server() as endpoint:
        setup = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        admin = boto3.client("s3", aws_access_key_id="x", aws_secret_access_key="x", **setup)
        admin.create_bucket(Bucket=BUCKET)
        admin.put_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/secret.json", Body=b'{"b": 1}')
        iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="x", **setup)
        creds = {}
        for tenant in ("team-a", "team-b"):
            iam.create_user(UserName=tenant)
            iam.put_user_policy(UserName=tenant, PolicyName="store", PolicyDocument=json.dumps(tenant_policy(tenant)))
            key = iam.create_access_key(UserName=tenant)["AccessKey"]
            creds[tenant] = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        assert requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10).ok  # enforce from now on
        yield endpoint, {t: boto3.client("s3", **c, **setup) for t, c in creds.items()}, creds


def denied(call) -> None:
    with pytest.raises(ClientError) as info:
        call()
    assert info.value.response["Error"]["Code"] in ("AccessDenied", "403"), info.value.response


def test_team_a_reads_and_writes_its_own_prefix(enforcing):
    _, s3, _ = enforcing
    s3["team-a"].put_object(Bucket=BUCKET, Key=f"{PREFIX}/team-a/x.json", Body=b"{}")
    assert s3["team-a"].get_object(Bucket=BUCKET, Key=f"{PREFIX}/team-a/x.json")["Body"].read() == b"{}"


def test_team_a_cannot_read_or_write_team_b_s_prefix(enforcing):
    _, s3, _ = enforcing
    denied(lambda: s3["team-a"].get_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/secret.json"))
    denied(lambda: s3["team-a"].put_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/forged.json", Body=b"{}"))
    # S3 keys are literal: `..` names another key under team-a's own prefix, not team-b's object.
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3["team-a"].get_object(Bucket=BUCKET, Key=f"{PREFIX}/team-a/../team-b/secret.json")
    denied(lambda: s3["team-a"].delete_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/secret.json"))
    assert s3["team-b"].get_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/secret.json")["Body"].read() == b'{"b": 1}'


def test_unsigned_or_unknown_keys_are_refused(enforcing):
    endpoint, _, _ = enforcing
    stranger = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="AKIAX", aws_secret_access_key="y"
    )
    with pytest.raises(ClientError):
        stranger.get_object(Bucket=BUCKET, Key=f"{PREFIX}/team-b/secret.json")


def test_decodebench_s_store_works_inside_the_policy_and_not_outside(enforcing, monkeypatch):
    endpoint, _, creds = enforcing
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["team-a"]["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["team-a"]["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("DECODEBENCH_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("DECODEBENCH_S3_RETRY_S", "1")
    store = S3Store.from_url(f"s3://{BUCKET}/{PREFIX}")
    store.write_json("team-a/sweeps/s1/plan.json", {"jobs": []})
    assert store.read_json("team-a/sweeps/s1/plan.json") == {"jobs": []}
    with pytest.raises(Exception) as info:
        store.read_json("team-b/secret.json")
    assert "team-b/secret.json" in str(info.value) or "AccessDenied" in str(info.value) or "403" in str(info.value)
