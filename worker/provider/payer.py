"""Deposit payer details and the rules of the interface's "Deposit payer details" table.

One function, `validate_payer`, is the gate for the worker (stored profiles at load and before a
submission) and for the sandbox (incoming bodies). It reports every problem at once, each naming
its field and carrying the provider's error code:

- 10000102: a mandatory field is missing (or blank);
- 10000103: a value is not accepted (bad enum, bad countryCode, unknown provider, too long, bad
  date, a field that must not be sent for the correspondentType, a withdrawn or unknown field);
- 10000106: walletAddress, network, memo, symbol or txHash sent when submitting for a received
  deposit (they come from the on-chain transaction).

Messages never repeat personal values (names, addresses, birthday, labels, wallet addresses).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum, StrEnum
from typing import Any, Literal

import pycountry
from pydantic import BaseModel, ConfigDict, Field

from worker.config.yamlkeys import suggest
from worker.errors import DepositdError
from worker.provider.codes import WalletCode
from worker.provider.jsonio import decimal_str

MISSING = WalletCode.INCOMPLETE.value
BAD_VALUE = WalletCode.BAD_VALUE.value
SOURCE_SENT = WalletCode.SOURCE_FIELDS_SENT.value

SOURCE_FIELDS = ("walletAddress", "network", "memo", "symbol", "txHash")
WITHDRAWN_FIELDS = ("countryInfo", "submitStatus")
ENTITY_FIELDS = ("fullName", "companyAddress")
INDIVIDUAL_FIELDS = ("firstName", "lastName", "birthday", "residentialAddress")
WALLET_LABEL_MAX = 50
OTHERS_MAX = 255

# Values of these fields are not personal data, so messages may quote them.
_QUOTABLE = frozenset({"correspondentType", "countryCode", "walletType", "addressType", "provider"})
_BIRTHDAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
# Rank of the code PayerValidationError.code reports when several problems are found.
_CODE_RANK = {SOURCE_SENT: 0, MISSING: 1, BAD_VALUE: 2}

PayerForm = Literal["submit", "register"]


class CorrespondentType(StrEnum):
    """Who the payer is."""

    ENTITY = "ENTITY"
    INDIVIDUAL = "INDIVIDUAL"


class WalletType(StrEnum):
    """Kind of wallet the deposit came from."""

    VASP = "VASP"
    OTHERS = "OTHERS"
    SELF_HOSTED = "SELF_HOSTED"


class AddressType(StrEnum):
    """Whether the source address is tied to one symbol (STANDARD) or not (UNIVERSAL)."""

    STANDARD = "STANDARD"
    UNIVERSAL = "UNIVERSAL"


@dataclass(frozen=True)
class PayerProblem:
    """One broken rule: the field, the provider's error code and a message naming the field."""

    field: str
    code: str
    message: str


class PayerValidationError(DepositdError, ValueError):
    """Payer details broke the rules; `problems` lists every one, `code` the main one."""

    def __init__(self, problems: list[PayerProblem]) -> None:
        self.problems = problems
        codes = [p.code for p in problems] or [BAD_VALUE]
        self.code = min(codes, key=lambda c: _CODE_RANK.get(c, 99))
        super().__init__("invalid payer details: " + "; ".join(p.message for p in problems))

    @property
    def fields(self) -> list[str]:
        """The fields named by the problems, in order."""
        return [p.field for p in self.problems]


class PayerDetails(BaseModel):
    """Validated payer details; personal fields are kept out of repr so they never reach logs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    correspondentType: CorrespondentType
    countryCode: str
    walletType: WalletType
    fullName: str | None = Field(default=None, repr=False)
    companyAddress: str | None = Field(default=None, repr=False)
    firstName: str | None = Field(default=None, repr=False)
    lastName: str | None = Field(default=None, repr=False)
    birthday: str | None = Field(default=None, repr=False)
    residentialAddress: str | None = Field(default=None, repr=False)
    provider: str | None = None
    othersPleaseSpecify: str | None = Field(default=None, repr=False)
    walletLabel: str | None = Field(default=None, repr=False)
    addressType: AddressType | None = None
    symbol: str | None = None
    memo: str | None = Field(default=None, repr=False)
    walletAddress: str | None = Field(default=None, repr=False)
    network: str | None = None
    txHash: str | None = None
    walletId: int | None = None

    def to_body(self) -> dict[str, Any]:
        """The JSON request body: only the fields that are set (walletId stays a number)."""
        return self.model_dump(mode="json", exclude_none=True)


# --- the rules -------------------------------------------------------------------------------


class _Checker:
    """Collects problems for one payload; each helper records at most one problem per field."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.problems: list[PayerProblem] = []
        self.clean: dict[str, Any] = {}
        self._flagged: set[str] = set()

    def add(self, field: str, code: str, message: str) -> None:
        if field not in self._flagged:
            self._flagged.add(field)
            self.problems.append(PayerProblem(field, code, message))

    def present(self, field: str) -> bool:
        return self.data.get(field) is not None

    def text(
        self, field: str, *, required: bool = False, max_len: int | None = None, when: str = ""
    ) -> str | None:
        """The field as a string, or None (recording a problem) when absent or unusable."""
        value = self.data.get(field)
        if value is None or (isinstance(value, str) and not value.strip() and required):
            if required:
                self.add(field, MISSING, f"{field} is mandatory{when}")
            return None
        if not isinstance(value, str):
            hint = " (quote it in YAML)" if isinstance(value, bool | int | float) else ""
            self.add(field, BAD_VALUE, f"{field} must be a string{hint}")
            return None
        if max_len is not None and len(value) > max_len:
            self.add(field, BAD_VALUE, f"{field} is longer than {max_len} characters")
            return None
        self.clean[field] = value
        return value

    def choice(self, field: str, enum: type[Enum], *, required: bool = False) -> str | None:
        value = self.text(field, required=required)
        if value is None:
            return None
        allowed = [str(member.value) for member in enum]
        if value not in allowed:
            self.clean.pop(field, None)
            self.add(field, BAD_VALUE, f"{field} must be one of {', '.join(allowed)}: {value!r}")
            return None
        return value

    def refuse(self, field: str, code: str, why: str) -> None:
        if self.present(field):
            self.add(field, code, f"{field} must not be sent {why}")


# Codes in common use that ISO 3166-1 alpha-2 spells otherwise.
_COUNTRY_ALIASES = {"UK": "GB", "EL": "GR"}


def country_hint(value: str) -> str:
    """`; did you mean 'GB'?` for a country code written another way (UK, gbr, gb), or nothing."""
    upper = value.strip().upper()
    fix = _COUNTRY_ALIASES.get(upper)
    if fix is None and len(upper) == 3 and upper.isascii():
        country = pycountry.countries.get(alpha_3=upper)
        fix = country.alpha_2 if country is not None else None
    if fix is None and len(upper) == 2 and upper.isascii() and upper != value:
        fix = upper if pycountry.countries.get(alpha_2=upper) is not None else None
    return f"; did you mean {fix!r}?" if fix else ""


def _check_country(c: _Checker) -> None:
    value = c.text("countryCode", required=True)
    if value is None:
        return
    hint = country_hint(value)
    if len(value) != 2 or not value.isascii() or not value.isupper():
        c.add(
            "countryCode",
            BAD_VALUE,
            f"countryCode must be two upper-case ISO 3166-1 letters{hint}",
        )
    elif pycountry.countries.get(alpha_2=value) is None:
        c.add(
            "countryCode",
            BAD_VALUE,
            f"countryCode {value!r} is not an ISO 3166-1 alpha-2 code{hint}",
        )
    else:
        return
    c.clean.pop("countryCode", None)


def _check_birthday(c: _Checker, when: str) -> None:
    value = c.data.get("birthday")
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        # An unquoted YAML date arrives as a date; it is the same yyyy-MM-dd value.
        c.clean["birthday"] = value.isoformat()
        return
    text = c.text("birthday", required=True, when=when)
    if text is None:
        return
    try:
        if not _BIRTHDAY_RE.fullmatch(text):
            raise ValueError
        dt.date.fromisoformat(text)
    except ValueError:
        c.clean.pop("birthday", None)
        c.add("birthday", BAD_VALUE, "birthday must be a real date in the format yyyy-MM-dd")


def _check_correspondent(c: _Checker) -> None:
    kind = c.choice("correspondentType", CorrespondentType, required=True)
    if kind == CorrespondentType.ENTITY.value:
        c.text("fullName", required=True, when=" for correspondentType ENTITY")
        c.text("companyAddress", required=True, when=" for correspondentType ENTITY")
        for field in INDIVIDUAL_FIELDS:
            c.refuse(field, BAD_VALUE, "for correspondentType ENTITY")
    elif kind == CorrespondentType.INDIVIDUAL.value:
        when = " for correspondentType INDIVIDUAL"
        c.text("firstName", required=True, when=when)
        c.text("lastName", required=True, when=when)
        _check_birthday(c, when)
        c.text("residentialAddress", required=True, when=when)
        for field in ENTITY_FIELDS:
            c.refuse(field, BAD_VALUE, "for correspondentType INDIVIDUAL")


def _check_wallet(c: _Checker, providers: Collection[str] | None) -> None:
    kind = c.choice("walletType", WalletType, required=True)
    provider = c.text(
        "provider", required=kind == WalletType.VASP.value, when=" when walletType is VASP"
    )
    if provider is not None and providers is not None and provider not in providers:
        c.clean.pop("provider", None)
        c.add("provider", BAD_VALUE, f"provider {provider!r} is not a name from the options list")
    c.text(
        "othersPleaseSpecify",
        required=kind == WalletType.OTHERS.value,
        max_len=OTHERS_MAX,
        when=" when walletType is OTHERS",
    )
    c.text("walletLabel", max_len=WALLET_LABEL_MAX)


def _check_address(c: _Checker, form: PayerForm) -> None:
    address_type = c.choice("addressType", AddressType)
    if form == "submit":
        for field in SOURCE_FIELDS:
            c.refuse(field, SOURCE_SENT, "when submitting for a received deposit")
        c.refuse("walletId", BAD_VALUE, "when submitting for a received deposit")
        return
    c.text("walletAddress", required=True, when=" to register a source address")
    c.text("network", required=True, when=" to register a source address")
    c.text("memo")
    c.text("txHash")
    symbol = c.text("symbol")
    if symbol is not None and not symbol.strip() and address_type != AddressType.UNIVERSAL.value:
        c.clean.pop("symbol", None)
        c.add("symbol", BAD_VALUE, "symbol may be empty only when addressType is UNIVERSAL")
    wallet_id = c.data.get("walletId")
    if wallet_id is not None:
        if isinstance(wallet_id, int) and not isinstance(wallet_id, bool) and wallet_id > 0:
            c.clean["walletId"] = wallet_id
        else:
            c.add("walletId", BAD_VALUE, "walletId must be a positive whole number")


_KNOWN = frozenset(PayerDetails.model_fields)


def _check_extra(c: _Checker) -> None:
    for field in c.data:
        if field in WITHDRAWN_FIELDS:
            c.add(field, BAD_VALUE, f"{field} is a withdrawn field and must not be sent")
        elif field not in _KNOWN:
            hint = suggest(str(field), _KNOWN - set(WITHDRAWN_FIELDS))
            c.add(str(field), BAD_VALUE, f"{field} is not a payer details field{hint}")


def payer_problems(
    data: Mapping[str, Any],
    *,
    form: PayerForm = "submit",
    providers: Collection[str] | None = None,
) -> tuple[list[PayerProblem], dict[str, Any]]:
    """Every broken rule of `data`, and the usable fields (for callers that want both)."""
    c = _Checker(data)
    _check_correspondent(c)
    _check_country(c)
    _check_wallet(c, providers)
    _check_address(c, form)
    _check_extra(c)
    return c.problems, c.clean


def validate_payer(
    data: Mapping[str, Any],
    *,
    form: PayerForm = "submit",
    providers: Collection[str] | None = None,
) -> PayerDetails:
    """Check payer details against every rule; raise `PayerValidationError` listing all problems.

    `form` is "submit" (payer details for a received deposit) or "register" (a source address).
    `providers`, when given, is the options endpoint's list of provider names.
    """
    problems, clean = payer_problems(data, form=form, providers=providers)
    if problems:
        raise PayerValidationError(problems)
    return PayerDetails.model_validate(clean)


def _canonical(obj: Any) -> Any:
    if isinstance(obj, Decimal):
        return decimal_str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dt.date):
        return obj.isoformat()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def content_hash(body: Mapping[str, Any]) -> str:
    """A stable sha256 hex of a payer body (canonical JSON, sorted keys) for idempotency keys."""
    text = json.dumps(
        dict(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_canonical
    )
    return hashlib.sha256(text.encode()).hexdigest()


def fields_named(text: str | None, body: Mapping[str, Any]) -> list[str]:
    """The payer fields (and keys of `body`) a provider message names, as whole words: what a
    refusal may show, never the values the message may echo (payer data)."""
    if not text:
        return []
    names = dict.fromkeys([*PayerDetails.model_fields, *WITHDRAWN_FIELDS, *map(str, body)])
    return [
        name
        for name in names
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text, re.I)
    ]
