"""Payer details: every rule of the interface's "Deposit payer details" table."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pycountry
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.errors import DepositdError
from worker.provider.payer import (
    SOURCE_FIELDS,
    PayerDetails,
    PayerProblem,
    PayerValidationError,
    content_hash,
    validate_payer,
)

MISSING, BAD, SOURCE = "10000102", "10000103", "10000106"
PROVIDER_NAMES = ("Binance", "OKX", "Coinbase")  # the same names as the provider_names fixture
ProfileFactory = Callable[..., dict[str, Any]]


def refused(data: dict[str, Any], **kwargs: Any) -> PayerValidationError:
    """Validate `data`, which must be refused, and return the error."""
    with pytest.raises(PayerValidationError) as info:
        validate_payer(data, **kwargs)
    return info.value


def problem(err: PayerValidationError, field: str) -> PayerProblem:
    """The one problem naming `field`."""
    found = [p for p in err.problems if p.field == field]
    assert len(found) == 1, err.problems
    assert field in found[0].message
    return found[0]


def only(err: PayerValidationError, field: str, code: str) -> None:
    """`err` has exactly one problem: `field` with `code`."""
    assert [(p.field, p.code) for p in err.problems] == [(field, code)]
    assert field in err.problems[0].message
    assert err.code == code


# --- valid details ---------------------------------------------------------------------------


def test_valid_entity_round_trips(entity_payer: ProfileFactory) -> None:
    """A complete ENTITY profile is accepted and its body is exactly what came in."""
    data = entity_payer()
    details = validate_payer(data, providers=PROVIDER_NAMES)
    assert isinstance(details, PayerDetails)
    assert details.to_body() == data


def test_valid_individual_round_trips(individual_payer: ProfileFactory) -> None:
    """A complete INDIVIDUAL profile is accepted and its body is exactly what came in."""
    data = individual_payer()
    assert validate_payer(data).to_body() == data


def test_none_values_count_as_absent(entity_payer: ProfileFactory) -> None:
    """A key with a null value (a blank YAML key) is treated as not sent."""
    data = {**entity_payer(), "firstName": None, "memo": None}
    assert "firstName" not in validate_payer(data).to_body()


def test_error_is_a_depositd_value_error(entity_payer: ProfileFactory) -> None:
    """PayerValidationError is both a DepositdError and a ValueError."""
    err = refused(entity_payer(countryCode="XX"))
    assert isinstance(err, DepositdError)
    assert isinstance(err, ValueError)
    assert "countryCode" in str(err)


# --- correspondentType -----------------------------------------------------------------------


def test_correspondent_type_missing(entity_payer: ProfileFactory) -> None:
    """correspondentType is mandatory (10000102)."""
    only(refused(entity_payer(correspondentType=None)), "correspondentType", MISSING)


@pytest.mark.parametrize("value", ["COMPANY", "entity", "", " "])
def test_correspondent_type_bad_value(entity_payer: ProfileFactory, value: str) -> None:
    """correspondentType other than ENTITY/INDIVIDUAL is refused; blank counts as missing."""
    code = MISSING if not value.strip() else BAD
    only(refused(entity_payer(correspondentType=value)), "correspondentType", code)


@pytest.mark.parametrize("field", ["fullName", "companyAddress"])
@pytest.mark.parametrize("value", [None, "", "   "])
def test_entity_mandatory(entity_payer: ProfileFactory, field: str, value: str | None) -> None:
    """ENTITY needs fullName and companyAddress (missing or blank: 10000102)."""
    data = entity_payer(**{field: None})
    if value is not None:
        data[field] = value
    err = refused(data)
    only(err, field, MISSING)
    assert "ENTITY" in err.problems[0].message


@pytest.mark.parametrize("field", ["firstName", "lastName", "birthday", "residentialAddress"])
def test_entity_refuses_individual_fields(entity_payer: ProfileFactory, field: str) -> None:
    """firstName, lastName, birthday, residentialAddress must not be sent for ENTITY (10000103)."""
    value = "1990-01-01" if field == "birthday" else "x"
    err = refused(entity_payer(**{field: value}))
    only(err, field, BAD)
    assert "must not be sent" in err.problems[0].message


@pytest.mark.parametrize("field", ["firstName", "lastName", "birthday", "residentialAddress"])
def test_individual_mandatory(individual_payer: ProfileFactory, field: str) -> None:
    """INDIVIDUAL needs firstName, lastName, birthday and residentialAddress (10000102)."""
    only(refused(individual_payer(**{field: None})), field, MISSING)


@pytest.mark.parametrize("field", ["fullName", "companyAddress"])
def test_individual_refuses_entity_fields(individual_payer: ProfileFactory, field: str) -> None:
    """fullName and companyAddress must not be sent for INDIVIDUAL (10000103)."""
    only(refused(individual_payer(**{field: "Acme"})), field, BAD)


# --- countryCode -----------------------------------------------------------------------------


def test_country_code_missing(entity_payer: ProfileFactory) -> None:
    """countryCode is mandatory for both kinds (10000102)."""
    only(refused(entity_payer(countryCode=None)), "countryCode", MISSING)


@pytest.mark.parametrize("value", ["XX", "ZZ", "UK", "sg", "Sg", "SGP", "S", "1A", "ÉÉ"])
def test_country_code_not_iso(entity_payer: ProfileFactory, value: str) -> None:
    """countryCode must be an assigned upper-case ISO 3166-1 alpha-2 code (10000103)."""
    only(refused(entity_payer(countryCode=value)), "countryCode", BAD)


def test_country_code_every_iso_code_accepted(entity_payer: ProfileFactory) -> None:
    """Every ISO 3166-1 alpha-2 code of pycountry is accepted."""
    codes = [country.alpha_2 for country in pycountry.countries]
    assert len(codes) > 240
    for code in codes:
        assert validate_payer(entity_payer(countryCode=code)).countryCode == code


def test_country_code_yaml_boolean(entity_payer: ProfileFactory) -> None:
    """An unquoted YAML NO (read as false) is refused with a hint to quote it."""
    err = refused(entity_payer(countryCode=False))
    only(err, "countryCode", BAD)
    assert "quote" in err.problems[0].message


# --- birthday --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "2023-02-30",
        "2023-13-01",
        "2023-00-10",
        "1990-1-2",
        "02/01/1990",
        "19900102",
        "1990-01-02T00",
    ],
)
def test_birthday_bad(individual_payer: ProfileFactory, value: str) -> None:
    """birthday must be yyyy-MM-dd and a real date (10000103)."""
    err = refused(individual_payer(birthday=value))
    only(err, "birthday", BAD)
    assert "yyyy-MM-dd" in err.problems[0].message


def test_birthday_leap_day(individual_payer: ProfileFactory) -> None:
    """A real leap day is accepted."""
    assert validate_payer(individual_payer(birthday="2000-02-29")).birthday == "2000-02-29"


def test_birthday_yaml_date(individual_payer: ProfileFactory) -> None:
    """An unquoted YAML date is accepted and sent as yyyy-MM-dd."""
    details = validate_payer(individual_payer(birthday=dt.date(1990, 1, 2)))
    assert details.to_body()["birthday"] == "1990-01-02"


# --- wallet ----------------------------------------------------------------------------------


def test_wallet_type_missing(entity_payer: ProfileFactory) -> None:
    """walletType is mandatory (the submit body carries it): 10000102."""
    only(refused(entity_payer(walletType=None, provider=None)), "walletType", MISSING)


@pytest.mark.parametrize("value", ["EXCHANGE", "vasp", "SELF-HOSTED"])
def test_wallet_type_bad(entity_payer: ProfileFactory, value: str) -> None:
    """walletType other than VASP/OTHERS/SELF_HOSTED is refused (10000103)."""
    only(refused(entity_payer(walletType=value)), "walletType", BAD)


@pytest.mark.parametrize("kind", ["VASP", "OTHERS", "SELF_HOSTED"])
def test_wallet_types_accepted(entity_payer: ProfileFactory, kind: str) -> None:
    """Each wallet type is accepted with its dependent field."""
    extra = {"OTHERS": {"othersPleaseSpecify": "Hardware vault"}}.get(kind, {})
    provider = "Binance" if kind == "VASP" else None
    data = entity_payer(walletType=kind, provider=provider, **extra)
    assert validate_payer(data).to_body() == data


def test_provider_mandatory_for_vasp(entity_payer: ProfileFactory) -> None:
    """provider is mandatory when walletType is VASP (10000102)."""
    err = refused(entity_payer(provider=None))
    only(err, "provider", MISSING)
    assert "VASP" in err.problems[0].message


def test_provider_must_be_from_options(entity_payer: ProfileFactory) -> None:
    """With the options list known, an unknown provider is refused (10000103)."""
    only(refused(entity_payer(provider="Binanse"), providers=PROVIDER_NAMES), "provider", BAD)


def test_provider_unchecked_without_options(entity_payer: ProfileFactory) -> None:
    """Without an options list, any provider name passes (checked online later)."""
    assert validate_payer(entity_payer(provider="Binanse")).provider == "Binanse"


def test_others_please_specify_mandatory(entity_payer: ProfileFactory) -> None:
    """othersPleaseSpecify is mandatory when walletType is OTHERS (10000102)."""
    only(refused(entity_payer(walletType="OTHERS", provider=None)), "othersPleaseSpecify", MISSING)


@pytest.mark.parametrize(("length", "ok"), [(255, True), (256, False)])
def test_others_please_specify_length(entity_payer: ProfileFactory, length: int, ok: bool) -> None:
    """othersPleaseSpecify is at most 255 characters (10000103 beyond)."""
    data = entity_payer(walletType="OTHERS", provider=None, othersPleaseSpecify="é" * length)
    if ok:
        validate_payer(data)
    else:
        only(refused(data), "othersPleaseSpecify", BAD)


@pytest.mark.parametrize(("length", "ok"), [(0, True), (50, True), (51, False)])
def test_wallet_label_length(entity_payer: ProfileFactory, length: int, ok: bool) -> None:
    """walletLabel is at most 50 characters (10000103 beyond)."""
    data = entity_payer(walletLabel="w" * length)
    if ok:
        assert validate_payer(data).walletLabel == "w" * length
    else:
        err = refused(data)
        only(err, "walletLabel", BAD)
        assert "50" in err.problems[0].message


@pytest.mark.parametrize("value", ["STANDARD", "UNIVERSAL"])
def test_address_type_accepted(entity_payer: ProfileFactory, value: str) -> None:
    """addressType STANDARD and UNIVERSAL are accepted."""
    assert validate_payer(entity_payer(addressType=value)).to_body()["addressType"] == value


def test_address_type_bad(entity_payer: ProfileFactory) -> None:
    """addressType other than STANDARD/UNIVERSAL is refused (10000103)."""
    only(refused(entity_payer(addressType="SPECIAL")), "addressType", BAD)


def test_non_string_value_refused(entity_payer: ProfileFactory) -> None:
    """A number where text is expected is refused (10000103), with a hint to quote it."""
    err = refused(entity_payer(walletLabel=12345))
    only(err, "walletLabel", BAD)
    assert "string" in err.problems[0].message


# --- withdrawn and unknown fields ------------------------------------------------------------


@pytest.mark.parametrize("field", ["countryInfo", "submitStatus"])
def test_withdrawn_fields_refused(entity_payer: ProfileFactory, field: str) -> None:
    """The withdrawn fields countryInfo and submitStatus are refused (10000103)."""
    err = refused({**entity_payer(), field: "x"})
    only(err, field, BAD)
    assert "withdrawn" in err.problems[0].message


def test_unknown_field_refused(entity_payer: ProfileFactory) -> None:
    """A field the table does not list is refused (10000103)."""
    only(refused({**entity_payer(), "nickname": "x"}), "nickname", BAD)


# --- the two forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", SOURCE_FIELDS)
def test_submit_refuses_source_fields(entity_payer: ProfileFactory, field: str) -> None:
    """Submitting for a received deposit refuses walletAddress/network/memo/symbol/txHash (106)."""
    err = refused({**entity_payer(), field: "x"}, form="submit")
    only(err, field, SOURCE)
    assert "received deposit" in err.problems[0].message


def test_submit_refuses_empty_source_field(entity_payer: ProfileFactory) -> None:
    """Even an empty memo is a source field sent on the submit form (10000106)."""
    only(refused({**entity_payer(), "memo": ""}), "memo", SOURCE)


def test_submit_refuses_wallet_id(entity_payer: ProfileFactory) -> None:
    """walletId belongs to the register form only (10000103 on submit)."""
    only(refused({**entity_payer(), "walletId": 1001}), "walletId", BAD)


def test_register_accepts_source_fields(entity_payer: ProfileFactory) -> None:
    """The register form takes walletAddress, network, memo, txHash, symbol and walletId."""
    data = {
        **entity_payer(),
        "walletAddress": "rPT1Sjq2YGrBMTttX4GZHjKu9dyfzbpAYe",
        "network": "XRP",
        "memo": "12345",
        "txHash": "ab" * 32,
        "symbol": "XRP",
        "walletId": 1001,
    }
    body = validate_payer(data, form="register").to_body()
    assert body == data
    assert body["walletId"] == 1001


@pytest.mark.parametrize("field", ["walletAddress", "network"])
def test_register_requires_address(entity_payer: ProfileFactory, field: str) -> None:
    """Registering needs walletAddress and network (10000102)."""
    data = {**entity_payer(), "walletAddress": "TQ5a", "network": "TRON"}
    del data[field]
    only(refused(data, form="register"), field, MISSING)


@pytest.mark.parametrize("value", [0, -1, True, "1001", 1.5])
def test_register_wallet_id_bad(entity_payer: ProfileFactory, value: Any) -> None:
    """walletId must be a positive whole number (10000103)."""
    data = {**entity_payer(), "walletAddress": "TQ5a", "network": "TRON", "walletId": value}
    only(refused(data, form="register"), "walletId", BAD)


@pytest.mark.parametrize(("address_type", "ok"), [("UNIVERSAL", True), ("STANDARD", False)])
def test_empty_symbol(entity_payer: ProfileFactory, address_type: str, ok: bool) -> None:
    """symbol may be empty only when addressType is UNIVERSAL."""
    data = entity_payer(addressType=address_type)
    data |= {"walletAddress": "0xabc", "network": "ETH", "symbol": ""}
    if ok:
        assert validate_payer(data, form="register").to_body()["symbol"] == ""
    else:
        only(refused(data, form="register"), "symbol", BAD)


def test_register_memo_optional(entity_payer: ProfileFactory) -> None:
    """memo is optional on the register form."""
    data = {**entity_payer(), "walletAddress": "TQ5a", "network": "TRON"}
    assert "memo" not in validate_payer(data, form="register").to_body()


# --- every problem at once, and the main code ------------------------------------------------


def test_every_problem_reported_at_once(individual_payer: ProfileFactory) -> None:
    """All broken rules are listed in one error, each naming its field."""
    data = individual_payer(firstName=None, countryCode="XX", birthday="2023-02-30")
    data |= {"fullName": "Acme", "countryInfo": "SG", "txHash": "ab"}
    err = refused(data)
    assert {(p.field, p.code) for p in err.problems} == {
        ("firstName", MISSING),
        ("countryCode", BAD),
        ("birthday", BAD),
        ("fullName", BAD),
        ("countryInfo", BAD),
        ("txHash", SOURCE),
    }
    for p in err.problems:
        assert p.field in p.message


def test_main_code_missing_over_bad(entity_payer: ProfileFactory) -> None:
    """With a missing field and a bad value, the main code is 10000102."""
    err = refused(entity_payer(fullName=None, countryCode="XX"))
    assert err.code == MISSING


def test_main_code_source_first(entity_payer: ProfileFactory) -> None:
    """With source fields on the submit form, the main code is 10000106 whatever else is wrong."""
    err = refused({**entity_payer(fullName=None, countryCode="XX"), "network": "TRON"})
    assert err.code == SOURCE


def test_personal_values_never_in_messages(individual_payer: ProfileFactory) -> None:
    """Messages and repr name fields, never personal values."""
    secret = "Zebediah Quixote"
    data = individual_payer(firstName=secret, residentialAddress=secret)
    data |= {"fullName": secret, "companyAddress": secret, "birthday": "1990-02-31"}
    err = refused(data)
    assert secret not in str(err)
    assert "1990-02-31" not in str(err)
    details = validate_payer(individual_payer(firstName=secret, residentialAddress=secret))
    assert secret not in repr(details)
    assert "1990-02-28" not in repr(details)


# --- content hash ----------------------------------------------------------------------------


def test_content_hash_known_value() -> None:
    """content_hash is sha256 of sorted, compact JSON."""
    body = {"walletType": "SELF_HOSTED", "countryCode": "SG"}
    expected = hashlib.sha256(b'{"countryCode":"SG","walletType":"SELF_HOSTED"}').hexdigest()
    assert content_hash(body) == expected


def test_content_hash_order_independent_and_value_sensitive(entity_payer: ProfileFactory) -> None:
    """Key order does not change the hash; any value change does."""
    body = validate_payer(entity_payer()).to_body()
    reordered = dict(reversed(list(body.items())))
    assert json.dumps(reordered) != json.dumps(body)
    assert content_hash(reordered) == content_hash(body)
    assert content_hash({**body, "walletLabel": "other"}) != content_hash(body)


# --- properties ------------------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40).filter(
    str.strip
)
countries = st.sampled_from(sorted(c.alpha_2 for c in pycountry.countries))
birthdays = st.dates(dt.date(1900, 1, 1), dt.date(2010, 12, 31)).map(dt.date.isoformat)
wallets = st.one_of(
    st.fixed_dictionaries(
        {"walletType": st.just("VASP"), "provider": st.sampled_from(PROVIDER_NAMES)}
    ),
    st.fixed_dictionaries(
        {
            "walletType": st.just("OTHERS"),
            "othersPleaseSpecify": st.text(min_size=1, max_size=255).filter(str.strip),
        }
    ),
    st.fixed_dictionaries({"walletType": st.just("SELF_HOSTED")}),
)
common_optional = {
    "walletLabel": st.text(max_size=50),
    "addressType": st.sampled_from(["STANDARD", "UNIVERSAL"]),
}
entities = st.fixed_dictionaries(
    {
        "correspondentType": st.just("ENTITY"),
        "fullName": texts,
        "companyAddress": texts,
        "countryCode": countries,
    },
    optional=common_optional,
)
individuals = st.fixed_dictionaries(
    {
        "correspondentType": st.just("INDIVIDUAL"),
        "firstName": texts,
        "lastName": texts,
        "birthday": birthdays,
        "residentialAddress": texts,
        "countryCode": countries,
    },
    optional=common_optional,
)
profiles = st.builds(
    lambda who, wallet: {**who, **wallet}, st.one_of(entities, individuals), wallets
)


@given(profiles)
def test_property_valid_profiles_round_trip(data: dict[str, Any]) -> None:
    """Any valid ENTITY or INDIVIDUAL profile is accepted and its body is unchanged."""
    assert validate_payer(data, providers=PROVIDER_NAMES).to_body() == data


@st.composite
def broken_profiles(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """A valid profile with exactly one rule broken, the field it names and the expected code."""
    data: dict[str, Any] = draw(profiles)
    entity = data["correspondentType"] == "ENTITY"
    mandatory = ["correspondentType", "countryCode", "walletType"]
    mandatory += ["fullName", "companyAddress"] if entity else list(INDIVIDUAL_ONLY)
    mandatory += {"VASP": ["provider"], "OTHERS": ["othersPleaseSpecify"]}.get(
        data["walletType"], []
    )
    other_kind = list(INDIVIDUAL_ONLY) if entity else ["fullName", "companyAddress"]
    rule = draw(
        st.sampled_from(
            [
                "missing",
                "other_kind",
                "country",
                "label",
                "enum",
                "withdrawn",
                "source",
                "unknown",
            ]
            + ([] if entity else ["birthday"])
            + (["provider"] if data["walletType"] == "VASP" else [])
            + (["others_long"] if data["walletType"] == "OTHERS" else [])
        )
    )
    if rule == "missing":
        field = draw(st.sampled_from(mandatory))
        data[field] = draw(st.sampled_from([None, "", "  "]))
        return data, field, MISSING
    if rule == "other_kind":
        field = draw(st.sampled_from(other_kind))
        data[field] = "1990-01-01" if field == "birthday" else draw(texts)
        return data, field, BAD
    if rule == "country":
        field, data["countryCode"] = "countryCode", draw(st.sampled_from(["XX", "sg", "SGP", "1"]))
        return data, field, BAD
    if rule == "label":
        field, data["walletLabel"] = "walletLabel", draw(st.text(min_size=51, max_size=80))
        return data, field, BAD
    if rule == "enum":
        field = draw(st.sampled_from(["correspondentType", "walletType", "addressType"]))
        data[field] = "BOGUS"
        return data, field, BAD
    if rule == "withdrawn":
        field = draw(st.sampled_from(["countryInfo", "submitStatus"]))
        data[field] = draw(texts)
        return data, field, BAD
    if rule == "source":
        field = draw(st.sampled_from(SOURCE_FIELDS))
        data[field] = draw(st.text(max_size=20))
        return data, field, SOURCE
    if rule == "unknown":
        field = draw(st.sampled_from(["nickname", "walletName", "email"]))
        data[field] = draw(texts)
        return data, field, BAD
    if rule == "birthday":
        data["birthday"] = draw(st.sampled_from(["2023-02-30", "1990-1-1", "01/02/1990"]))
        return data, "birthday", BAD
    if rule == "provider":
        data["provider"] = draw(texts.filter(lambda name: name not in PROVIDER_NAMES))
        return data, "provider", BAD
    data["othersPleaseSpecify"] = draw(st.text(min_size=256, max_size=300))
    return data, "othersPleaseSpecify", BAD


INDIVIDUAL_ONLY = ("firstName", "lastName", "birthday", "residentialAddress")


@given(broken_profiles())
def test_property_one_broken_rule_is_named(case: tuple[dict[str, Any], str, str]) -> None:
    """A valid profile with exactly one rule broken is refused, naming that field and code."""
    data, field, code = case
    with pytest.raises(PayerValidationError) as info:
        validate_payer(data, providers=PROVIDER_NAMES)
    assert [(p.field, p.code) for p in info.value.problems] == [(field, code)]
    assert field in info.value.problems[0].message
